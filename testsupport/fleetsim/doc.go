// Package fleetsim is the fleet simulator behind corral-sim and `make
// bench-fleet`: N simulated machines and M simulated hypervisor nodes
// against a real corrald (the built binary, its own process and bbolt
// data directory) over real sockets in two network namespaces it makes
// and removes. Each machine does the real protocol steps, timed: firmware
// DHCP (PXE options, broadcast on the appliance's segment or through a
// relay with giaddr), iPXE's DHCP, the iPXE script from its leased
// address, the kernel and initramfs fetches (ranged by default), and the
// real discovery agent session client (agent/session) with a simulated
// installer that makes a real node key; once the appliance reboots it, it
// boots again and heartbeats as a node (ApplyNode over mTLS with the
// certificate the install got), like hypervisor/node. The report is per
// phase p50/p99, the appliance's CPU, memory and store, and correctness:
// machines inventoried in the appliance's own view, duplicate addresses,
// NOT_READY flaps.
//
// With Config.Appliances above one the row storms a fleet: a three-member
// etcd cluster (Debian's etcd-server, local processes in a namespace of
// the run) and that many corrald on --store etcd, each in its own
// namespace with its own address on one boot segment (a bridge in the
// machines' namespace), all serving DHCP from one range; a broadcast
// reaches every appliance and the relay forwards to each. Machines boot
// from whichever appliance answers first, agents and nodes dial the
// endpoints their script and install plan name. The report adds each
// appliance's own view of the row, its CPU, memory, run-queue wait,
// store writes and conflicts and DHCP share, and each etcd member's disk
// commits, fsyncs and proposals; leases are checked as etcd holds them.
//
// Test support only: product code never imports it. It needs root.
package fleetsim
