#!/usr/bin/env bash
# sbesp.sh SHIM GRUB IN.qcow2 OUT.qcow2 — the CloudInit image with the
# Secure Boot chain in its EFI system partition, in the removable-media
# (fallback) position firmware boots with no boot entries:
# \EFI\BOOT\BOOTX64.EFI is Debian's shim (signed by Microsoft's UEFI CA),
# \EFI\BOOT\grubx64.efi beside it is Debian's signed GRUB (shim loads that
# name from its own directory; no fbx64.efi, so shim does not run the
# fallback that writes boot entries), and GRUB's configuration boots the
# image's own kernel (Debian's signed cloud kernel, which GRUB verifies
# through shim) and initramfs from the same partition. Debian's signed
# GRUB reads $prefix/grub.cfg with prefix /EFI/debian, else
# $cmdpath/grub.cfg: the configuration is in both. The systemd-boot files
# stay (nothing loads them). Edited with mtools on the partition's offset:
# no loop device or mount.
#
# Needs: qemu-utils fdisk mtools; SHIM and GRUB from shim-signed and
# grub-efi-amd64-signed.
set -euo pipefail
shim=$1 grub=$2 in=$3 out=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/corral-sbesp.XXXXXX")
trap 'rm -rf "$work"' EXIT
disk=$work/disk.raw
qemu-img convert -f qcow2 -O raw "$in" "$disk"
# Partition 1 (the ESP: FAT, MBR type ef) in 512-byte sectors.
start=$(sfdisk -d "$disk" | awk -F'[=,]' '/^[^ ]*1 :/ {gsub(/ /, "", $2); print $2}')
[ -n "$start" ] || { echo "sbesp: no partition 1 in $in" >&2; exit 1; }
esp="$disk@@$((start * 512))"
cmdline="root=LABEL=root ro console=tty0 console=ttyS0,115200 net.ifnames=0"
cat > "$work/grub.cfg" <<CFG
set timeout=0
echo 'Corral test image: Debian signed kernel through shim and signed GRUB'
linux /vmlinuz $cmdline
initrd /initrd.img
boot
CFG
mcopy -o -i "$esp" "$shim" ::/EFI/BOOT/BOOTX64.EFI
mcopy -o -i "$esp" "$grub" ::/EFI/BOOT/grubx64.efi
mcopy -o -i "$esp" "$work/grub.cfg" ::/EFI/BOOT/grub.cfg
mmd -i "$esp" ::/EFI/debian
mcopy -o -i "$esp" "$work/grub.cfg" ::/EFI/debian/grub.cfg
qemu-img convert -f raw -O qcow2 "$disk" "$out.tmp"
mv "$out.tmp" "$out"
