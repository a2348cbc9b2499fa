#!/bin/sh
# DHCPv6 SOLICIT→ADVERTISE→REQUEST→REPLY against corrald's boot/dhcp6 and
# Kea's kea-dhcp6 (memfile leases, persisted), A/B interleaved, with
# perfdhcp -6 from a namespace across a veth. Prints perfdhcp's figures;
# asserts nothing. Needs root, kea-dhcp6-server, kea-admin (perfdhcp) and
# a built corrald (go build -o /tmp/corrald ./cmd/corrald).
# Usage: bench/dhcp6.sh [rate] [seconds] [rounds]
set -eu
RATE=${1:-2000}; SECS=${2:-10}; ROUNDS=${3:-2}
CORRALD=${CORRALD:-/tmp/corrald}
ID=$$; S=d6s$ID; C=d6c$ID; D=$(mktemp -d)
cleanup() { ip netns del $S 2>/dev/null || true; ip netns del $C 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
. "$(dirname "$0")/dhcp6env.sh"
run_perf() {
  ip netns exec $C perfdhcp -6 -l vc$ID -r "$RATE" -p "$SECS" -R 1000000 -b duid=0001000100000000 2>&1 |
    grep -E "sent packets|received packets|drops ratio|min delay|avg delay|max delay|std deviation|Rate:" | sed 's/^/    /'
}
for r in $(seq "$ROUNDS"); do
  echo "round $r: corrald boot/dhcp6 (bbolt, leases by CAS)"
  rm -rf "$D/corral"
  ip netns exec $S "$CORRALD" serve --data-dir "$D/corral" --api-listen :0 --boot-interface vs$ID --dhcp-mode off \
    --dhcp6-range fd78::1000-fd78::ffff --http-listen 127.0.0.1:0 --tftp-listen off --no-ra --allow-test-images --log-level warn >"$D/corrald.log" 2>&1 &
  P=$!; sleep 4
  run_perf
  kill $P 2>/dev/null || tail -5 "$D"/*.log "$D"/*.out 2>/dev/null; wait $P 2>/dev/null || true
  echo "round $r: kea-dhcp6 2.2 (memfile, persisted)"
  rm -f "$D/kea-leases6.csv"*
  KEA_PIDFILE_DIR="$D" KEA_LOCKFILE_DIR="$D" ip netns exec $S kea-dhcp6 -c "$D/kea.json" >"$D/kea.out" 2>&1 &
  P=$!; sleep 3
  run_perf
  kill $P 2>/dev/null || true; wait $P 2>/dev/null || true; grep -h -m3 -i "error\|fatal" "$D/kea.out" "$D/kea.log" 2>/dev/null || true
done
