// Package agent holds the code that runs on a machine, in subpackages:
// cmdline (the kernel command-line contract), coldplug (drivers by
// modalias), netup (DHCP on the boot NIC), facts (hardware facts over a
// root path), bmc (in-band BMC LAN settings), session (Register and the
// command session with the appliance, failing over along the fleet's
// endpoints), install (the data disk and the node identity), hvboot
// (`corral-node hypervisor --boot`) and discover (`corral-node discover`,
// which wires them). None of it may import store/, boot/,
// ipmi/, bbolt, etcd or bmclib: the initramfs stays small and the trust
// boundary clear.
package agent
