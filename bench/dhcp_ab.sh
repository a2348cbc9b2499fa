#!/bin/sh
# DHCP before/after: two corrald binaries (A, B) measured in the same run,
# interleaved A,B,A,B... REPEATS times each, with bench/cmd/dora (new
# clients relayed from the client namespace, as in dhcp.sh): DORA p50/p99
# at RATE offered/s, leases/s offered far past the knee (SAT/s for 5 s),
# and a burst of BURST new clients (leases/s = BURST / time until the last
# is leased). Each measurement gets a fresh server (empty data dir). Prints
# every run and the median per binary; asserts nothing. On a shared
# machine only the interleaved medians are worth comparing.
# Usage: bench/dhcp_ab.sh A_CORRALD B_CORRALD   (e.g. built at two commits)
. "$(dirname "$0")/lib.sh"
A=${1:?usage: dhcp_ab.sh A_CORRALD B_CORRALD}
B=${2:?usage: dhcp_ab.sh A_CORRALD B_CORRALD}
REPEATS=${REPEATS:-3}
RATE=${RATE:-4862}
SAT=${SAT:-16000}
BURST=${BURST:-3000}
setup
RES=$OUT/results
: >"$RES"

start_corrald() { start_server "corrald=$1"; }

echo "== DHCP A/B, interleaved, $REPEATS repeats: A=$A B=$B"
for i in $(seq $REPEATS); do
	for v in A B; do
		eval bin=\$$v
		start_corrald "$bin"
		lat=$(client "$BIN/dora" -local $CLIENT -server $SERVER -rate $RATE -duration 10s)
		unserve
		start_corrald "$bin"
		sat=$(client "$BIN/dora" -local $CLIENT -server $SERVER -rate $SAT -duration 5s)
		unserve
		start_corrald "$bin"
		burst=$(client "$BIN/dora" -local $CLIENT -server $SERVER -burst $BURST -timeout 10s)
		unserve
		p50=$(ms "$(field "$lat" p50)")
		p99=$(ms "$(field "$lat" p99)")
		satls=$(field "$sat" leases/s)
		last=$(ms "$(echo "$burst" | sed -n 's/.*all leased after \([^ ]*\) .*/\1/p')")
		leased=$(echo "$burst" | sed -n 's/.*leased \([0-9]*\),.*/\1/p')
		bls=$(awk -v n="$leased" -v t="$last" 'BEGIN{ if (t>0) printf "%.0f", n*1000/t; else print 0 }')
		printf '%s run %d: p50 %s ms p99 %s ms at %d/s; %s leases/s offered %d/s; burst %d: %s leased in %s ms = %s leases/s\n' \
			$v $i "$p50" "$p99" $RATE "$satls" $SAT $BURST "$leased" "$last" "$bls"
		echo "$v $p50 $p99 $satls $bls" >>"$RES"
	done
done
echo
awk '
	function median(a, n,   i, j, t) { for (i=1; i<=n; i++) for (j=i+1; j<=n; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
		return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
	{ n[$1]++; p50[$1, n[$1]]=$2; p99[$1, n[$1]]=$3; sat[$1, n[$1]]=$4; bls[$1, n[$1]]=$5 }
	END {
		for (v in n) {
			for (i=1; i<=n[v]; i++) { a[i]=p50[v, i]; b[i]=p99[v, i]; c[i]=sat[v, i]; d[i]=bls[v, i] }
			m50[v]=median(a, n[v]); m99[v]=median(b, n[v]); msat[v]=median(c, n[v]); mb[v]=median(d, n[v])
			printf "median %s (n=%d): DORA p50 %.2f ms p99 %.2f ms; %.0f leases/s (saturated); burst %.0f leases/s\n", v, n[v], m50[v], m99[v], msat[v], mb[v]
		}
		if (msat["A"] > 0 && mb["A"] > 0)
			printf "B/A: leases/s saturated %.2f, burst %.2f; p50 %.2f, p99 %.2f\n", msat["B"]/msat["A"], mb["B"]/mb["A"], m50["B"]/m50["A"], m99["B"]/m99["A"]
	}' "$RES"
