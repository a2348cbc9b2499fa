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
// Test support only: product code never imports it. It needs root.
package fleetsim
