#!/bin/sh
# DHCP on bbolt vs etcd (docs/fleet.md): leases/s and DORA p50/p99 of
#   bolt   one corrald, leases in its bbolt file;
#   etcd   one corrald, leases in a three-member etcd cluster;
#   etcd2  two corrald on that cluster sharing the segment: the load
#          generator relays every DISCOVER and REQUEST to both (a relay
#          with two helper addresses); each client takes the first OFFER;
# interleaved bolt, etcd, etcd2, bolt, ... REPEATS times, every
# measurement on a fresh server and a fresh etcd cluster (empty data):
# bench/cmd/dora at RATE/s for 10 s (DORA p50/p99), at SAT/s for 5 s
# (leases/s far past the knee) and a burst of BURST new clients (leases/s
# = clients / time until the last is leased). Then, per repeat, the
# duplicate check under load (CONTENTION, default etcd2): the two
# appliances on a 256-address range,
# CRATE new clients/s for 10 s, each RELEASEing its lease CHOLD after its
# ACK (the range is recycled many times over): dora counts addresses
# ACKed to a second MAC while the first holds them, and compares the live
# leases in etcd with what the clients hold.
#
# Topology: the client namespace holds a bridge; the appliances' and the
# etcd members' namespaces hang off it by veths. Both appliances are
# pinned to SERVER_CPU, the etcd members to ETCD_CPUS (default: the same
# core: the server side gets one core in every column), the load
# generator to CLIENT_CPU. Prints figures; asserts nothing.
# Usage: bench/dhcp_fleet.sh [configs...]   (default: bolt etcd etcd2;
# AB=0 runs only the duplicate check)
. "$(dirname "$0")/lib.sh"
REPEATS=${REPEATS:-3}
RATE=${RATE:-1000}
SAT=${SAT:-8000}
BURST=${BURST:-2000}
CRATE=${CRATE:-250}
CHOLD=${CHOLD:-100ms}
ETCD_CPUS=${ETCD_CPUS:-$SERVER_CPU}
CONFIGS=${*:-bolt etcd etcd2}
CONTENTION=${CONTENTION-etcd2}
command -v etcd >/dev/null || { log "missing etcd (Debian package etcd-server)"; exit 1; }
setup

NS_S2=cbench-t$ID
NS_E=cbench-e$ID
BR=cbbr$ID
SERVER2=10.64.0.3
ETCD_IP=10.64.0.10
EP=http://$ETCD_IP:2379,http://$ETCD_IP:12379,http://$ETCD_IP:22379
EPIDS=""
S2PID=""
fleet_teardown() {
	for p in $S2PID $EPIDS; do kill "$p" 2>/dev/null || true; done
	for p in $S2PID $EPIDS; do wait "$p" 2>/dev/null || true; done
	ip netns del $NS_S2 2>/dev/null || true
	ip netns del $NS_E 2>/dev/null || true
	teardown
}
trap fleet_teardown EXIT INT TERM

# The client side becomes a bridge with the first server's veth on it;
# the second server and the etcd members join it.
ip -n $NS_C addr del $CLIENT/$PREFIX dev $IF_C
ip -n $NS_C link add $BR type bridge
ip -n $NS_C link set $IF_C master $BR
ip -n $NS_C addr add $CLIENT/$PREFIX dev $BR
ip -n $NS_C link set $BR up
join() { # NS IF_INSIDE IF_ON_BRIDGE ADDR
	ip netns add $1
	ip -n $1 link set lo up
	ip -n $1 link add $2 type veth peer name $3 netns $NS_C
	ip -n $NS_C link set $3 master $BR
	ip -n $NS_C link set $3 up
	ip -n $1 addr add $4/$PREFIX dev $2
	ip -n $1 link set $2 up
}
join $NS_S2 cbt$ID cbu$ID $SERVER2
join $NS_E cbe$ID cbf$ID $ETCD_IP

etcd_start() {
	rm -rf "$OUT/etcd"
	mkdir -p "$OUT/etcd"
	cluster=m1=http://$ETCD_IP:2380,m2=http://$ETCD_IP:12380,m3=http://$ETCD_IP:22380
	for m in 1 2 3; do
		c=$(( (m - 1) * 10000 + 2379 ))
		ip netns exec $NS_E taskset -c $ETCD_CPUS etcd --name m$m --data-dir "$OUT/etcd/m$m" \
			--listen-client-urls http://$ETCD_IP:$c --advertise-client-urls http://$ETCD_IP:$c \
			--listen-peer-urls http://$ETCD_IP:$((c + 1)) --initial-advertise-peer-urls http://$ETCD_IP:$((c + 1)) \
			--initial-cluster $cluster --initial-cluster-state new --initial-cluster-token corral-bench-$ID \
			--logger zap --log-outputs stderr --log-level warn >"$OUT/etcd/m$m.log" 2>&1 &
		EPIDS="$EPIDS $!"
	done
	tries=0
	until ip netns exec $NS_E etcdctl --endpoints=$EP --command-timeout=2s put /bench/health ok >/dev/null 2>&1; do
		tries=$((tries + 1))
		[ $tries -lt 60 ] || { log "etcd did not come up:"; tail -5 "$OUT"/etcd/m*.log >&2; exit 1; }
		sleep 0.5
	done
}

etcd_stop() {
	for p in $EPIDS; do kill "$p" 2>/dev/null || true; done
	for p in $EPIDS; do wait "$p" 2>/dev/null || true; done
	EPIDS=""
}

# wait_dhcp NS PID LOG: until the DHCP socket of the corrald in NS is bound.
wait_dhcp() {
	tries=0
	until [ -n "$(ip netns exec $1 ss -Hlun 'sport = :67' 2>/dev/null)" ]; do
		kill -0 $2 2>/dev/null || { log "corrald in $1 exited:"; tail -20 "$3" >&2; exit 1; }
		tries=$((tries + 1))
		[ $tries -lt 300 ] || { log "corrald in $1 serves no DHCP after 30 s"; tail -20 "$3" >&2; exit 1; }
		sleep 0.1
	done
}

COMMON="--api-listen 127.0.0.1:20180 --dhcp-mode full --tftp-listen off --http-listen 127.0.0.1:0 --no-ra --log-level warn"
# start CONFIG [RANGE]: fresh state (and a fresh etcd cluster) and the
# appliance(s) of CONFIG serving RANGE; sets DST (dora's -server).
start() {
	range=${2:-10.65.0.0-10.79.255.254}
	rm -rf "$OUT/st1" "$OUT/st2"
	case $1 in
	bolt)
		READY_WAIT=0 serve corrald "$BIN/corrald" serve --data-dir "$OUT/st1" --boot-interface $IF_S --dhcp-range $range $COMMON
		wait_dhcp $NS_S $SPID "$OUT/corrald.log"
		DST=$SERVER ;;
	etcd | etcd2)
		etcd_start
		READY_WAIT=0 serve corrald "$BIN/corrald" serve --data-dir "$OUT/st1" --boot-interface $IF_S --dhcp-range $range $COMMON \
			--store etcd --etcd-endpoints $EP --etcd-prefix /bench --appliance-name s1
		wait_dhcp $NS_S $SPID "$OUT/corrald.log"
		DST=$SERVER
		if [ "$1" = etcd2 ]; then
			ip netns exec $NS_S2 taskset -c $SERVER_CPU "$BIN/corrald" serve --data-dir "$OUT/st2" --boot-interface cbt$ID \
				--dhcp-range $range $COMMON --store etcd --etcd-endpoints $EP --etcd-prefix /bench --appliance-name s2 \
				--cluster-key "$OUT/st1/cluster.key" >"$OUT/corrald2.log" 2>&1 &
			S2PID=$!
			wait_dhcp $NS_S2 $S2PID "$OUT/corrald2.log"
			DST=$SERVER,$SERVER2
		fi ;;
	esac
	sleep 0.5
}

stop() {
	unserve
	if [ -n "$S2PID" ]; then
		kill $S2PID 2>/dev/null || true
		wait $S2PID 2>/dev/null || true
		S2PID=""
	fi
	etcd_stop
}

# ms DURATION: a Go duration (850µs, 1.15ms, 1.2s) in milliseconds.
ms() { echo "$1" | awk '{ v=$1; if (sub(/µs$/,"",v)) print v/1000; else if (sub(/ms$/,"",v)) print v; else if (sub(/s$/,"",v)) print v*1000; else print "nan" }'; }
# field LINE WORD: the token after WORD in LINE.
field() { echo "$1" | awk -v w="$2" '{ for (i=1; i<NF; i++) if ($i==w) { print $(i+1); exit } }'; }

RES=$OUT/results
: >"$RES"
echo "== DHCP on bbolt vs etcd (3 members), interleaved, $REPEATS repeats: $CONFIGS"
echo "   server side on CPU $SERVER_CPU (etcd members on $ETCD_CPUS), load generator on CPU $CLIENT_CPU"
for rep in $(seq $REPEATS); do
	[ "${AB:-1}" = 1 ] && for cf in $CONFIGS; do
		start $cf
		lat=$(client "$BIN/dora" -local $CLIENT -server $DST -rate $RATE -duration 10s)
		stop
		start $cf
		sat=$(client "$BIN/dora" -local $CLIENT -server $DST -rate $SAT -duration 5s)
		stop
		start $cf
		burst=$(client "$BIN/dora" -local $CLIENT -server $DST -burst $BURST -timeout 10s)
		stop
		p50=$(ms "$(field "$lat" p50)")
		p99=$(ms "$(field "$lat" p99)")
		satls=$(field "$sat" leases/s)
		last=$(ms "$(echo "$burst" | sed -n 's/.*all leased after \([^ ]*\) .*/\1/p')")
		leased=$(echo "$burst" | sed -n 's/.*leased \([0-9]*\),.*/\1/p')
		bls=$(awk -v n="$leased" -v t="$last" 'BEGIN{ if (t>0) printf "%.0f", n*1000/t; else print 0 }')
		naks=$(($(field "$lat" naks) + $(field "$sat" naks) + $(field "$burst" naks)))
		dups=$(($(field "$lat" duplicates) + $(field "$sat" duplicates) + $(field "$burst" duplicates)))
		printf '%-5s run %d: p50 %s ms p99 %s ms at %d/s; %s leases/s offered %d/s; burst %d: %s leased in %s ms = %s leases/s; naks %d duplicates %d\n' \
			$cf $rep "$p50" "$p99" $RATE "$satls" $SAT $BURST "$leased" "$last" "$bls" $naks $dups
		echo "$cf $p50 $p99 $satls $bls" >>"$RES"
	done
	for cf in $CONTENTION; do
		start $cf 10.64.1.0-10.64.1.255
		out=$(client "$BIN/dora" -local $CLIENT -server $DST -rate $CRATE -duration 10s -release $CHOLD -etcd $EP -etcd-prefix /bench)
		stop
		echo "$out" | sed "s/^/$cf contention run $rep, 256 addresses, hold $CHOLD: /"
	done
done
echo
awk '
	function median(a, n,   i, j, t) { for (i=1; i<=n; i++) for (j=i+1; j<=n; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
		return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
	{ if (!($1 in n)) order[++k]=$1; n[$1]++; p50[$1, n[$1]]=$2; p99[$1, n[$1]]=$3; sat[$1, n[$1]]=$4; bls[$1, n[$1]]=$5 }
	END {
		for (o=1; o<=k; o++) {
			v=order[o]
			for (i=1; i<=n[v]; i++) { a[i]=p50[v, i]; b[i]=p99[v, i]; c[i]=sat[v, i]; d[i]=bls[v, i] }
			printf "median %-5s (n=%d): DORA p50 %.2f ms p99 %.2f ms; %.0f leases/s (saturated); burst %.0f leases/s\n", v, n[v], median(a, n[v]), median(b, n[v]), median(c, n[v]), median(d, n[v])
		}
	}' "$RES"
