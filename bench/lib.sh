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
CLIENT_CPU=${CLIENT_CPU:-0}
OUT=${BENCH_DIR:-/var/tmp/corral-bench-$ID}
REPO=$(cd "$(dirname "$0")/.." && pwd)
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
	ip netns exec $NS_S taskset -c $SERVER_CPU "$@" >"$OUT/$name.log" 2>&1 &
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
client() { ip netns exec $NS_C taskset -c $CLIENT_CPU "$@"; }

# ticks PID: user+system CPU clock ticks used so far, reaped children
# included (tftpd-hpa forks one per transfer).
ticks() { awk '{print $14+$15+$16+$17}' /proc/$1/stat; }

rcvbuf_errors() { ip netns exec $NS_S awk '/^Udp: [0-9]/{print $6}' /proc/net/snmp; }

# cpu_busy CPU: busy clock ticks of one CPU so far (/proc/stat), for
# servers that fork per request (their children's time is not always
# reaped into the parent's counters by the end of a case).
cpu_busy() { awk -v c="cpu$1" '$1==c {print $2+$3+$4+$7+$8}' /proc/stat; }
