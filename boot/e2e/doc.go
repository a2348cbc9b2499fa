// Package e2e holds the network-boot end-to-end tests: corrald runs as a
// process inside a network namespace the test creates (bridge, taps,
// veths), and real clients boot from it: QEMU SeaBIOS with its iPXE NIC
// ROMs, QEMU q35 with OVMF firmware PXE, iPXE next to a real dnsmasq in
// proxy mode, and a relay agent. The tests assert from the boot timeline
// (`corral machine timeline`) and from the guest console.
//
// Tests skip with a one-line reason when not root or when ip, QEMU, OVMF
// or dnsmasq is absent. A real Linux test kernel is used when one is found
// (CORRAL_TEST_KERNEL, or images/testkernel/fetch.sh's cache); otherwise
// Debian's ipxe.lkrn stands in as the kernel and the guest-side assertion
// stops at the kernel download.
//
// Nothing here is imported by the product.
package e2e
