#!/bin/sh
# DHCPv6 SOLICIT→ADVERTISE→REQUEST→REPLY latency (p50/p99) and leases/s,
# corrald's boot/dhcp6 (bbolt) against Kea's kea-dhcp6 (memfile,
# persisted), interleaved A/B/A/B..., with bench/cmd/dhcp6load from a
# namespace across a veth (perfdhcp prints no percentiles). Prints
# figures; asserts nothing. Needs root and kea-dhcp6-server.
# Usage: bench/dhcp6_ab.sh [seconds] [rounds] [concurrency]
set -eu
SECS=${1:-8}; ROUNDS=${2:-3}; CONC=${3:-32}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=$(mktemp -d); ID=$$; S=d6s$ID; C=d6c$ID
cleanup() { ip netns del $S 2>/dev/null || true; ip netns del $C 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$D/corrald" ./cmd/corrald && go build -o "$D/dhcp6load" ./bench/cmd/dhcp6load)
. "$(dirname "$0")/dhcp6env.sh"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); ${SECS}s per run, $CONC exchanges in flight, $(nproc) cores"
for r in $(seq "$ROUNDS"); do
  rm -rf "$D/corral"
  ip netns exec $S "$D/corrald" serve --data-dir "$D/corral" --api-listen :0 --boot-interface vs$ID --dhcp-mode off \
    --dhcp6-range fd78::1000-fd78::ffff --http-listen 127.0.0.1:0 --metrics-listen "" --tftp-listen off --no-ra \
    --allow-test-images --log-level warn >"$D/corrald.log" 2>&1 &
  P=$!; sleep 4
  printf 'round %s corrald: ' "$r"; ip netns exec $C "$D/dhcp6load" -iface vc$ID -concurrency "$CONC" -duration "${SECS}s"
  kill $P; wait $P 2>/dev/null || true
  rm -f "$D/kea-leases6.csv"*
  KEA_PIDFILE_DIR="$D" KEA_LOCKFILE_DIR="$D" ip netns exec $S kea-dhcp6 -c "$D/kea.json" >"$D/kea.out" 2>&1 &
  P=$!; sleep 3
  printf 'round %s kea:     ' "$r"; ip netns exec $C "$D/dhcp6load" -iface vc$ID -concurrency "$CONC" -duration "${SECS}s"
  kill $P; wait $P 2>/dev/null || true
  grep -h -m3 -i "error\|fatal" "$D/kea.out" "$D/kea.log" 2>/dev/null || true
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
