# The DHCPv6 benchmarks' lab, sourced by dhcp6.sh and dhcp6_ab.sh: the
# server's namespace $S and the client's $C joined by a veth (vs$ID, vc$ID)
# on fd78::/64, and Kea's configuration in $D/kea.json (memfile leases,
# persisted). The caller sets ID, S, C, D and the cleanup trap.
ip netns add $S; ip netns add $C
ip link add vs$ID type veth peer name vc$ID
ip link set vs$ID netns $S; ip link set vc$ID netns $C
ip -n $S link set lo up; ip -n $C link set lo up
ip -n $S addr add fd78::1/64 dev vs$ID nodad; ip -n $S link set vs$ID up
ip -n $C addr add fd78::2/64 dev vc$ID nodad; ip -n $C link set vc$ID up
sleep 2 # link-local addresses leave tentative state
cat >"$D/kea.json" <<KEA
{ "Dhcp6": { "data-directory": "$D", "interfaces-config": { "interfaces": [ "vs$ID" ] },
  "lease-database": { "type": "memfile", "persist": true, "name": "$D/kea-leases6.csv", "lfc-interval": 0 },
  "preferred-lifetime": 3600, "valid-lifetime": 3600, "renew-timer": 1800, "rebind-timer": 2880,
  "subnet6": [ { "id": 1, "subnet": "fd78::/64", "interface": "vs$ID", "pools": [ { "pool": "fd78::1000-fd78::ffff" } ] } ],
  "loggers": [ { "name": "kea-dhcp6", "severity": "WARN", "output_options": [ { "output": "$D/kea.log" } ] } ] } }
KEA
