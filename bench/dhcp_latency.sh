#!/bin/sh
# DORA latency of corrald alone at one offered rate (default 4,862/s, half
# its knee on the lab machine) for RUNS runs: a quick check of a change.
# Prints figures; asserts nothing.
. "$(dirname "$0")/lib.sh"
RATE=${RATE:-4862}
RUNS=${RUNS:-2}
setup
for i in $(seq $RUNS); do
	start_server corrald
	printf 'corrald run %d: ' $i
	client "$BIN/dora" -local $CLIENT -server $SERVER -rate $RATE -duration 10s
	unserve
done
