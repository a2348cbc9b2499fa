// Package images will own the artifact catalog (kernels, initramfs, iPXE
// binaries, VM images, checksums) and the initramfs builders.
package images
