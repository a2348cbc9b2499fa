// Package hypervisor will own the node side (QEMU/QMP, qcow2 volumes,
// bridges and taps, cloud-init seeds) and the appliance-side BlockStorage,
// VirtualMachine and Image services.
package hypervisor
