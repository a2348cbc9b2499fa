# Shared setup for the benchmark scripts (sourced). Two network namespaces
# joined by a veth: the server side (pinned to SERVER_CPU) and the client
# side (pinned to CLIENT_CPU). Every process started is tracked by pid and
# stopped by pid; the namespaces are deleted on exit.
set -eu
ID=${BENCH_ID:-$$}
NS_S=cbench-s$ID
NS_C=cbench-c$ID
IF_S=cbs$ID
IF_C=cbc$ID
SERVER=10.64.0.1
CLIENT=10.64.0.2
PREFIX=12
SERVER_CPU=${SERVER_CPU:-1}
# NICE (e.g. -5, root) raises the server's and the load generator's
# priority on a machine others load: a one-thread server (Kea, corrald
# with GOMAXPROCS=1) otherwise gets 1/N of a core shared with N other
# runnable threads, and a many-thread one more. Default 0.
CLIENT_CPU=${CLIENT_CPU:-0}
OUT=${BENCH_DIR:-/var/tmp/corral-bench-$ID}
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=$OUT/bin
PIDS=""

log() { printf '%s\n' "$*" >&2; }

setup() {
	for t in ip taskset go; do command -v $t >/dev/null || { log "missing $t"; exit 1; }; done
	[ "$(id -u)" = 0 ] || { log "run as root (network namespaces)"; exit 1; }
	mkdir -p "$OUT" "$BIN"
	(cd "$REPO" && go build -o "$BIN/" ./cmd/corrald ./bench/cmd/...)
	ip netns add $NS_S
	ip netns add $NS_C
	ip -n $NS_S link set lo up
	ip -n $NS_C link set lo up
	ip -n $NS_S link add $IF_S type veth peer name $IF_C netns $NS_C
	ip -n $NS_S addr add $SERVER/$PREFIX dev $IF_S
	ip -n $NS_C addr add $CLIENT/$PREFIX dev $IF_C
	ip -n $NS_S link set $IF_S up
	ip -n $NS_C link set $IF_C up
	trap teardown EXIT INT TERM
}

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	ip netns del $NS_S 2>/dev/null || true
	ip netns del $NS_C 2>/dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$OUT"
}

# serve NAME CMD...: start a server in the server namespace, pinned; sets
# SPID (also remembered for teardown).
serve() {
	name=$1
	shift
	ip netns exec $NS_S nice -n "${NICE:-0}" taskset -c $SERVER_CPU "$@" >"$OUT/$name.log" 2>&1 &
	SPID=$!
	PIDS="$PIDS $SPID"
	sleep "${READY_WAIT:-1.5}"
	kill -0 $SPID 2>/dev/null || { log "$name did not start:"; tail -20 "$OUT/$name.log" >&2; exit 1; }
}

unserve() {
	kill "$SPID" 2>/dev/null || true
	wait "$SPID" 2>/dev/null || true
	PIDS=$(echo "$PIDS" | tr ' ' '\n' | grep -v "^$SPID$" | tr '\n' ' ')
}

# client CMD...: run in the client namespace, pinned.
client() { ip netns exec $NS_C nice -n "${NICE:-0}" taskset -c $CLIENT_CPU "$@"; }

# ticks PID: user+system CPU clock ticks used so far, reaped children
# included (tftpd-hpa forks one per transfer).
ticks() { awk '{print $14+$15+$16+$17}' /proc/$1/stat; }

# steal: clock ticks (USER_HZ) the hypervisor kept this VM's CPUs from
# running, summed over the CPUs. On the lab VM a run that pushes the VM
# over its host CPU allowance shows here: the whole VM is stopped for
# milliseconds at a time, every server's tail with it (bench/results/2026-11-dhcp.md,
# 24 Nov 2026, the commit window). 0 on bare metal.
steal() { awk '$1=="cpu" {print $9+0}' /proc/stat; }

rcvbuf_errors() { ip netns exec $NS_S awk '/^Udp: [0-9]/{print $6}' /proc/net/snmp; }

# cpu_busy CPU: busy clock ticks of one CPU so far (/proc/stat), for
# servers that fork per request (their children's time is not always
# reaped into the parent's counters by the end of a case).
cpu_busy() { awk -v c="cpu$1" '$1==c {print $2+$3+$4+$7+$8}' /proc/stat; }

# start_server SERVER: start one DHCP server in the server namespace on a
# fresh state directory, leases on disk. SERVER is kea, dnsmasq, corrald
# (the binary built from this tree) or LABEL=PATH (a corrald binary, e.g.
# built at another commit: before=/tmp/corrald-old). Sets SPID.
start_server() {
	label=${1%%=*}
	bin="$BIN/corrald"
	case $1 in *=*) bin=${1#*=} ;; esac
	st=$OUT/state-$label
	rm -rf "$st"
	# The root filesystem here is mounted with online discard: the blocks
	# of the state just deleted are discarded at the next ext4 journal
	# commit, which a fresh server's first flushes (new files, a growing
	# bbolt file) would otherwise wait behind, for up to ~0.5 s. Commit
	# them now, before the server starts.
	sync -f "$OUT" 2>/dev/null || sync
	mkdir -p "$st"
	case $label in
	kea)
		cat >"$st/kea.json" <<JSON
{"Dhcp4": {
  "interfaces-config": {"interfaces": ["$IF_S"], "dhcp-socket-type": "udp"},
  "lease-database": {"type": "memfile", "persist": true, "name": "$st/leases4.csv", "lfc-interval": 0},
  "multi-threading": {"enable-multi-threading": false},
  "valid-lifetime": 3600,
  "subnet4": [{"subnet": "10.64.0.0/12", "pools": [{"pool": "10.65.0.0 - 10.79.255.254"}]}],
  "loggers": [{"name": "kea-dhcp4", "severity": "WARN", "output_options": [{"output": "$st/kea.log"}]}]
}}
JSON
		KEA_PIDFILE_DIR=$st KEA_LOCKFILE_DIR=$st serve kea kea-dhcp4 -c "$st/kea.json" ;;
	dnsmasq)
		serve dnsmasq dnsmasq --no-daemon --conf-file=/dev/null --port=0 --interface=$IF_S --bind-interfaces \
			--dhcp-range=10.65.0.0,10.79.255.254,255.240.0.0,1h --dhcp-lease-max=4000000 --no-ping \
			--dhcp-leasefile="$st/dnsmasq.leases" --pid-file="$st/dnsmasq.pid" ;;
	*)
		serve "$label" "$bin" serve --data-dir "$st" --api-listen $SERVER:20180 --boot-interface $IF_S \
			--dhcp-mode full --dhcp-range 10.65.0.0-10.79.255.254 --tftp-listen off --http-listen 127.0.0.1:0 --no-ra --log-level warn ;;
	esac
}

# perfdhcp_fields OUTPUT: "leases/s drop% avg_ms" from perfdhcp's report:
# REQUEST-ACK exchanges per second, the worse of the two exchanges' drop
# ratios, and the REQUEST-ACK average delay.
perfdhcp_fields() {
	echo "$1" | awk '
		/^Rate:/ { rate=$2 }
		/drops ratio/ { n++; d[n]=$3 }
		/avg delay/ { m++; if (m==2) avg=$3 }
		END { x=(d[1]>d[2])?d[1]:d[2]; if (n<2) x=100; printf "%s %s %s\n", (rate==""?0:rate), x, (avg==""?"-":avg) }'
}

# ms DURATION: a Go duration (850µs, 1.15ms, 1.2s) in milliseconds.
ms() { echo "$1" | awk '{ v=$1; if (sub(/µs$/,"",v)) print v/1000; else if (sub(/ms$/,"",v)) print v; else if (sub(/s$/,"",v)) print v*1000; else print "nan" }'; }

# field LINE WORD: the token after WORD in LINE.
field() { echo "$1" | awk -v w="$2" '{ for (i=1; i<NF; i++) if ($i==w) { print $(i+1); exit } }'; }

# corrald_metrics: the server's /metrics figures a DORA run is read by,
# one "name value" per line (empty for a server without corrald's
# /metrics: Kea, dnsmasq). ACKs are the REQUEST answers of
# corral_dhcp_answer_seconds (from the request's arrival to the answer).
corrald_metrics() {
	ip netns exec $NS_S curl -s --max-time 2 http://127.0.0.1:9180/metrics 2>/dev/null | awk '
		$1=="go_memstats_alloc_bytes_total" || $1=="go_gc_duration_seconds_count" { print $1, $2 }
		$1=="corral_dhcp_answer_seconds_bucket{type=\"request\",le=\"0.005\"}" { print "acks_le_5ms", $2 }
		$1=="corral_dhcp_answer_seconds_count{type=\"request\"}" { print "acks", $2 }' || true
}

# corrald_run_figures BEFORE AFTER LEASES: ", GC cycles N, B bytes/lease,
# ACKs over 5 ms by corrald's clock N" for a run, from two
# corrald_metrics readings; empty when the server has none.
corrald_run_figures() {
	[ -n "$1" ] && [ -n "$2" ] || return 0
	{ echo "$1" | sed 's/^/0 /'; echo "$2" | sed 's/^/1 /'; } | awk -v n="${3:-0}" '
		{ v[$1, $2] = $3 }
		function d(k) { return v[1, k] - v[0, k] }
		END { if (n <= 0) n = 1
			printf ", GC cycles %d, %d bytes/lease, ACKs over 5 ms by corrald'"'"'s clock %d of %d",
				d("go_gc_duration_seconds_count"), d("go_memstats_alloc_bytes_total") / n,
				d("acks") - d("acks_le_5ms"), d("acks") }'
}
