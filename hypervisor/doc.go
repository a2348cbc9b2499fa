// Package hypervisor is the root of Corral's virtual-machine layer. It
// holds no code itself; its sub-packages split along the trust boundary
// between a hypervisor node and the appliance:
//
// Node side (run by `corral-node hypervisor`, reachable from
// cmd/corral-node, so they import only the standard library, gRPC/protobuf,
// the generated api/ packages, Corral's leaf packages (internal/apierr for
// errors, internal/nodeid for the identity layout) and their own kept
// libraries — never bbolt, etcd, bmclib or Corral's store/, ipmi/, boot/):
//
//   - hypervisor/volume: qcow2 volumes with qemu-img (empty, copy-on-write
//     overlays by backing file, http(s) fetch with size cap, timeout and
//     SHA-256 into a temporary file, resize, delete);
//   - hypervisor/vm: QEMU processes (daemonized, -S, QMP over a unix socket
//     via go-qemu, VNC on a unix socket, KVM or TCG), rediscovered from
//     pid files and QMP sockets after an agent restart;
//   - hypervisor/netdev: Linux bridges per Network, VLAN sub-interfaces on
//     the uplink (itself optionally a bond over NICs), taps per NIC,
//     through netlink;
//   - hypervisor/cloudinit: NoCloud seed ISOs built in Go;
//   - hypervisor/node: the HypervisorService server over mTLS, node
//     enrolment and the ApplyNode heartbeat (Config + Run).
//
// Appliance side: hypervisor/appliance (BlockStorage, VirtualMachine and
// Image services and their scheduling onto nodes), which calls nodes only
// through corral.hypervisor.v1.HypervisorService.
package hypervisor
