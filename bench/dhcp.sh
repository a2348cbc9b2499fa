#!/bin/sh
# DHCP benchmark: perfdhcp DORA sweep (new clients at each offered rate,
# fresh server state per step) against corrald (full mode, leases durable
# in bbolt on disk), Kea (kea-dhcp4-server, memfile on disk, single
# thread) and dnsmasq (--no-ping, lease file on disk); then DORA latency
# at half corrald's knee and a burst of new clients (bench/cmd/dora).
# Server pinned to one core. Prints figures; asserts nothing.
# Usage: bench/dhcp.sh [servers...]   (default: corrald kea dnsmasq)
#        server = corrald | kea | dnsmasq | LABEL=/path/to/corrald (another
#        build, e.g. before=/tmp/corrald-old). The DORA latency runs at half
#        the knee of corrald, or else of the first server listed.
. "$(dirname "$0")/lib.sh"
RATES=${RATES:-"1000 2000 3000 4000 5000 6000 8000 10000 12000 16000"}
PERIOD=${PERIOD:-5}
BURST=${BURST:-3000}
SERVERS=${*:-corrald kea dnsmasq}
for t in perfdhcp; do command -v $t >/dev/null || { log "missing $t (Debian package kea-admin)"; exit 1; }; done
setup

echo "== DHCP: DORA sweep, new clients, ${PERIOD}s per step, server pinned to CPU $SERVER_CPU =="
for srv in $SERVERS; do
	label=${srv%%=*}
	knee=0
	bad=0
	for r in $RATES; do
		start_server $srv
		t0=$(ticks $SPID)
		out=$(client perfdhcp -4 -r $r -p $PERIOD -R 4000000 -l $CLIENT $SERVER 2>&1 || true)
		t1=$(ticks $SPID)
		unserve
		got=$(echo "$out" | awk '/^Rate:/{print $2}')
		d1=$(echo "$out" | awk '/drops ratio/{print $3; exit}')
		d2=$(echo "$out" | awk '/drops ratio/{n++; if (n==2) print $3}')
		a2=$(echo "$out" | awk '/avg delay/{n++; if (n==2) print $3}')
		drop=$(awk -v a="${d1:-100}" -v b="${d2:-100}" 'BEGIN{x=(a>b)?a:b; if (x!=x) x=100; print x}')
		cpu=$(awk -v t=$((t1 - t0)) -v g="${got:-0}" -v p=$PERIOD 'BEGIN{ if (g>0) printf "%.0f", t*10000/(g*p); else print "-" }')
		printf '%-8s offered %6d/s: %8.0f leases/s, drops DO %s%% RA %s%%, RA avg %s ms, server CPU %s us/lease\n' \
			$label $r "${got:-0}" "${d1:-?}" "${d2:-?}" "${a2:-?}" "$cpu"
		if awk -v d="$drop" 'BEGIN{exit !(d<=2.5)}'; then
			knee=$(awk -v g="${got:-0}" -v k=$knee 'BEGIN{print (g>k)?g:k}')
			bad=0
		else
			bad=$((bad + 1))
			[ $bad -ge 2 ] && break
		fi
	done
	echo "$label knee: $knee leases/s at <= 2.5% drop"
	eval "knee_$label=$knee"
done
first=${SERVERS%% *}
first=${first%%=*}
eval "kref=\${knee_corrald:-\${knee_$first:-2000}}"
half=$(awk -v k="$kref" 'BEGIN{printf "%d", k/2}')
echo
echo "== DHCP: DORA latency at half corrald's (else $first's) knee ($half/s, 10s) and a burst of $BURST new clients =="
for srv in $SERVERS; do
	label=${srv%%=*}
	start_server $srv
	printf '%-8s ' $label
	st0=$(steal)
	out=$(client "$BIN/dora" -local $CLIENT -server $SERVER -rate $half -duration 10s)
	echo "$out, VM steal ticks $(($(steal) - st0)), load $(cut -d' ' -f1 /proc/loadavg)"
	unserve
	start_server $srv
	before=$(rcvbuf_errors)
	printf '%-8s ' $label
	client "$BIN/dora" -local $CLIENT -server $SERVER -burst $BURST -timeout 4s
	echo "$label     kernel RcvbufErrors during the burst: $(($(rcvbuf_errors) - before))"
	unserve
done
for srv in $SERVERS; do k=${srv%%=*}; eval "v=\${knee_$k:-0}"; echo "knee $k $v"; done | awk '
	{k[$2]=$3} END { if (!(k["corrald"]>0)) exit; if (k["kea"]>0) printf "ratio corrald/kea %.2f\n", k["corrald"]/k["kea"]; if (k["dnsmasq"]>0) printf "ratio corrald/dnsmasq %.2f\n", k["corrald"]/k["dnsmasq"] }'
