#!/usr/bin/env bash
# syslinuxdisk.sh KERNEL INITRD APPEND OUT.qcow2 — a bootable disk with an
# MBR (SYSLINUX's mbr.bin) and one active FAT partition holding SYSLINUX,
# the kernel and the initramfs; converted to qcow2. No loop devices, no
# mounts: mkfs.vfat on a file, mtools, syslinux --install on the file.
#
# Needs: syslinux syslinux-common mtools dosfstools fdisk qemu-utils.
set -euo pipefail
kernel=$1 initrd=$2 append=$3 out=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/corral-disk.XXXXXX")
trap 'rm -rf "$work"' EXIT

sz=$(( ( $(stat -c %s "$kernel") + $(stat -c %s "$initrd") ) / 1048576 + 8 ))
(( sz < 32 )) && sz=32
boot=$work/boot.img
mkfs.vfat -n BOOT -C "$boot" $((sz * 1024)) >/dev/null
cat > "$work/syslinux.cfg" <<CFG
SERIAL 0 115200
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND $append
CFG
mcopy -i "$boot" "$kernel" ::/vmlinuz
mcopy -i "$boot" "$initrd" ::/initrd.img
mcopy -i "$boot" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$boot"

disk=$work/disk.raw
truncate -s "$((sz + 2))M" "$disk"
sfdisk -q "$disk" <<PT
label: dos
start=1MiB, size=${sz}MiB, type=6, bootable
PT
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$boot" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
qemu-img convert -f raw -O qcow2 "$disk" "$out.tmp"
mv "$out.tmp" "$out"
