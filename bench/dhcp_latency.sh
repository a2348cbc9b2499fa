#!/bin/sh
# DORA latency of corrald alone at one offered rate (default 4,862/s, half
# its knee on the lab machine) for RUNS runs: a quick check of a change.
# Prints figures; asserts nothing.
. "$(dirname "$0")/lib.sh"
RATE=${RATE:-4862}
RUNS=${RUNS:-2}
setup
for i in $(seq $RUNS); do
	rm -rf "$OUT/st"
	serve corrald "$BIN/corrald" serve --data-dir "$OUT/st" --api-listen 127.0.0.1:20180 --boot-interface $IF_S \
		--dhcp-mode full --dhcp-range 10.65.0.0-10.79.255.254 --tftp-listen off --http-listen 127.0.0.1:0 --no-ra --log-level warn
	printf 'corrald run %d: ' $i
	client "$BIN/dora" -local $CLIENT -server $SERVER -rate $RATE -duration 10s
	unserve
done
