// Package e2e holds the discovery end-to-end tests: the real discovery
// image (images/discovery: Debian kernel, curated modules, u-root with
// corral-node discover) boots in QEMU (TCG) and registers with a real
// corrald.
//
//   - TestPXEDiscovery: corrald serves DHCP/TFTP/HTTP in a network namespace
//     the test creates; a machine with SMBIOS identity, two virtio disks with
//     serials and an e1000 NIC PXE-boots into the image registered by
//     `corrald images build` and appears in `corral get machines -o json`;
//     booted again with a virtio NIC (new MAC) it is the same machine.
//   - TestFastLoop: the development loop: the same image booted with
//     -kernel/-initrd and QEMU user networking reaching corrald on the host
//     loopback through 10.0.2.2, with an OpenIPMI ipmi_sim BMC attached
//     (ipmi-bmc-extern + isa-ipmi-bt) whose LAN address the agent reads
//     in-band and reports.
//   - TestDiscoveryImageMkfs and TestHypervisorImageRunsQEMU: both images
//     unpacked and chrooted into (only /dev and /proc from the host): the
//     discovery image's mke2fs formats ext4; the hypervisor image's qemu-img
//     makes a qcow2 and its QEMU runs a VM with the node's own command line
//     (hypervisor/vm.Args, TCG) plus a virtio-net NIC, proving the
//     ldd-resolved libraries, the TCG module and the firmware complete.
//   - TestDebInstall: the operator's install: the .deb built with nfpm from
//     packaging/nfpm.yaml, dpkg -i'd into a clean minbase Debian root
//     (mmdebstrap, cached in /var/cache/corral/debian-root), its files,
//     modes, conffile and unit (systemd-analyze verify) checked; the
//     installed corrald, as the corral user with only the unit's
//     capabilities, refuses a tampered images archive, imports the packaged
//     one and PXE-boots a QEMU machine to INVENTORIED.
//   - TestSecureBootDiscovery: `corrald serve --secure-boot`; OVMF's
//     Secure Boot firmware with Microsoft's keys PXE-boots shim → signed
//     GRUB → the image's signed Debian kernel to INVENTORIED (facts,
//     describe and timeline say Secure Boot on, lockdown integrity), then,
//     accepted, the agent hands over to the hypervisor image with
//     kexec_file_load and the machine is DEPLOYED.
//   - TestSecureBootDeploy: the same chain discovers a machine, which is
//     accepted into a pool, allocated and deployed with a Debian image whose
//     ESP holds shim and signed GRUB at \EFI\BOOT\ (testsupport/guestimage
//     SecureBootCloudInit); it boots that disk under Secure Boot, phones
//     home, and over SSH reports SecureBoot=1 and lockdown integrity; its
//     kernel tampered with on the disk, GRUB refuses it through shim.
//     9-14 minutes under TCG: runs only with CORRAL_SB_DEPLOY=1.
//   - TestARM64Discovery: an arm64 QEMU machine under AAVMF (TCG)
//     network-boots through GRUB's arm64 loader into the arm64 discovery
//     image to INVENTORIED.
//   - TestARM64Deploy: that machine, with a disk, accepted, allocated and
//     deployed with testsupport/guestimage's ARM64Tiny (GRUB as the ESP's
//     \EFI\BOOT\BOOTAA64.EFI, Debian's arm64 cloud kernel, a cloud-init
//     subset) and user data; the network GRUB chainloads the disk's
//     loader, the OS phones home (DEPLOYED) and answers SSH.
//
// The images are built once per run into CORRAL_IMAGE_CACHE (default
// /var/cache/corral/discovery) and reused while its inputs are unchanged.
// Tests skip with a one-line reason when not root or when a tool (ip,
// QEMU, apt, dpkg-deb, depmod, xz, ipmi_sim) is absent.
//
// Nothing here is imported by the product.
package e2e
