// Package images owns the artifact catalog: the fixed, read-only set of
// files network boot may serve (iPXE binaries from Debian's ipxe package,
// the kernel and initramfs of each boot profile: discover, and hypervisor,
// which boots the discovery kernel with its own initramfs), kept in one
// directory with their SHA-256 checksums. images/discovery builds both
// initramfs images. Artifacts fetched from peer appliances of a fleet are
// kept beside the catalog by content (ContentDir/<sha256>), stored only
// after their size and hash are checked (Receive), and found by hash
// (Held) whether fetched or the catalog's own.
//
// It imports nothing of Corral's; boot/tftp and boot/http look artifacts up
// by name here and serve nothing else.
package images
