#!/bin/sh
# DHCP through a relay, as a new user would measure it: perfdhcp in the
# client namespace sends UNICAST to the server as a relay agent (-l the
# client interface: giaddr = its address, replies come back to port 67 of
# that address), new clients at each offered rate for PERIOD s, every
# server pinned to one core (SERVER_CPU) on a fresh state directory with
# its leases on disk (corrald: bbolt, fsync before the ACK; Kea: memfile
# CSV). Servers, rates and repeats are interleaved: for each repeat, for
# each rate, each server in turn. Server CPU per lease is the server's
# utime+stime (/proc/PID/stat) over the leases perfdhcp counted.
# Then DORA p50/p99 at LAT_RATE (default: half the first server's knee in
# this run, the knee being the highest median leases/s at <= 2.5 % drop)
# with bench/cmd/dora, again interleaved, each run with the server's CPU
# ticks and the VM's steal ticks (lib.sh), and for corrald its GC cycles,
# bytes allocated per lease and ACKs over 5 ms by its own clock (its
# /metrics, corral_dhcp_answer_seconds). Prints every run and the medians;
# asserts nothing. On a shared machine only interleaved medians count:
# the load average is printed before and after.
# Usage: bench/dhcp_relay.sh [server...]   server = corrald | kea | dnsmasq
#        | LABEL=/path/to/corrald (another build, e.g. before=/tmp/corrald-old)
# Knobs: RATES ("2000 4000 8000"; " " skips the sweep), PERIOD (10),
# REPEATS (3), LAT_RATE, BENCH_DIR (state on another filesystem, e.g.
# /dev/shm/x: flushes cost nothing there).
. "$(dirname "$0")/lib.sh"
RATES=${RATES:-"2000 4000 8000"}
PERIOD=${PERIOD:-10}
REPEATS=${REPEATS:-3}
SERVERS=${*:-corrald kea}
command -v perfdhcp >/dev/null || { log "missing perfdhcp (Debian package kea-admin)"; exit 1; }
setup
RES=$OUT/relay-results
LAT=$OUT/relay-latency
: >"$RES"
: >"$LAT"

echo "== DHCP relayed (perfdhcp -l $IF_C unicast to $SERVER, giaddr $CLIENT), ${PERIOD}s per rate, $REPEATS interleaved repeats, servers pinned to CPU $SERVER_CPU"
echo "load before: $(uptime)"
for i in $(seq $REPEATS); do
	for r in $RATES; do
		for srv in $SERVERS; do
			label=${srv%%=*}
			start_server "$srv"
			t0=$(ticks $SPID)
			st0=$(steal)
			out=$(client perfdhcp -4 -r $r -p $PERIOD -R 4000000 -l $IF_C $SERVER 2>&1 || true)
			st1=$(steal)
			t1=$(ticks $SPID)
			unserve
			set -- $(perfdhcp_fields "$out")
			cpu=$(awk -v t=$((t1 - t0)) -v g="$1" -v p=$PERIOD -v hz="$(getconf CLK_TCK)" 'BEGIN{ if (g>0) printf "%.0f", t*1e6/hz/(g*p); else print 0 }')
			printf 'run %d %-8s offered %5d/s: %6.0f leases/s, drop %5s%%, REQUEST-ACK avg %s ms, server CPU %s us/lease, VM steal ticks %d\n' \
				$i "$label" $r "$1" "$2" "$3" "$cpu" $((st1 - st0))
			echo "$label $r $1 $2 $cpu" >>"$RES"
		done
	done
done
echo "load after the sweep: $(uptime)"

# medians FILE: per (server, rate) the median of every numeric column.
summary=$(awk '
	function median(a, n,   i, j, t) { for (i=1; i<=n; i++) for (j=i+1; j<=n; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
		return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
	{ k=$1 " " $2; if (!(k in n)) order[++nk]=k; n[k]++; ls[k, n[k]]=$3; dr[k, n[k]]=$4; cpu[k, n[k]]=$5 }
	END { for (x=1; x<=nk; x++) { k=order[x]
		for (i=1; i<=n[k]; i++) { a[i]=ls[k, i]; b[i]=dr[k, i]; c[i]=cpu[k, i] }
		print k, median(a, n[k]), median(b, n[k]), median(c, n[k]), n[k] } }' "$RES")
echo
echo "== medians: server, offered/s, leases/s, drop %, CPU us/lease (n)"
echo "$summary" | awk '{ printf "median %-8s offered %5d/s: %6.0f leases/s, drop %5.2f%%, server CPU %4.0f us/lease (n=%d)\n", $1, $2, $3, $4, $5, $6 }'

first=${SERVERS%% *}
first=${first%%=*}
knee=$(echo "$summary" | awk -v s="$first" '$1==s && $4<=2.5 && $3>k {k=$3} END{print k+0}')
LAT_RATE=${LAT_RATE:-$(awk -v k="$knee" 'BEGIN{ printf "%d", (k>0)?k/2:1000 }')}
echo
echo "== DORA latency at $LAT_RATE/s for 10 s (bench/cmd/dora relayed from $CLIENT; $first knee here: $knee leases/s), $REPEATS interleaved repeats"
for i in $(seq $REPEATS); do
	for srv in $SERVERS; do
		label=${srv%%=*}
		start_server "$srv"
		t0=$(ticks $SPID)
		st0=$(steal)
		m0=$(corrald_metrics)
		out=$(client "$BIN/dora" -local $CLIENT -server $SERVER -rate $LAT_RATE -duration 10s)
		m1=$(corrald_metrics)
		st1=$(steal)
		t1=$(ticks $SPID)
		unserve
		printf 'run %d %-8s %s server CPU ticks %d, VM steal ticks %d, load %s%s\n' $i "$label" "$out" $((t1 - t0)) $((st1 - st0)) "$(cut -d' ' -f1 /proc/loadavg)" \
			"$(corrald_run_figures "$m0" "$m1" "$(field "$out" leased)")"
		p50=$(ms "$(field "$out" p50)")
		p99=$(ms "$(field "$out" p99)")
		echo "$label $p50 $p99 $((t1 - t0))" >>"$LAT"
	done
done
echo "load after the latency runs: $(uptime)"
awk '
	function median(a, n,   i, j, t) { for (i=1; i<=n; i++) for (j=i+1; j<=n; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
		return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
	{ k=$1; if (!(k in n)) order[++nk]=k; n[k]++; p50[k, n[k]]=$2; p99[k, n[k]]=$3 }
	END { for (x=1; x<=nk; x++) { k=order[x]
		for (i=1; i<=n[k]; i++) { a[i]=p50[k, i]; b[i]=p99[k, i] }
		printf "median %-8s DORA p50 %.2f ms p99 %.2f ms at %d/s (n=%d)\n", k, median(a, n[k]), median(b, n[k]), r, n[k] } }' r="$LAT_RATE" "$LAT"
