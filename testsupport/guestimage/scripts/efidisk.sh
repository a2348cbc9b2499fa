#!/usr/bin/env bash
# efidisk.sh KERNEL INITRD APPEND OUT.qcow2 — an arm64 UEFI disk: a GPT
# with one EFI system partition (FAT) holding \EFI\BOOT\BOOTAA64.EFI (GRUB
# from Debian's grub-efi-arm64-bin, grub-mkimage with an embedded config
# that boots the kernel and initramfs beside it), the kernel and the
# initramfs; converted to qcow2. No loop devices, no mounts: mkfs.vfat on a
# file, mtools, sfdisk and dd on the disk file.
#
# Needs: grub-efi-arm64-bin grub-common mtools dosfstools fdisk qemu-utils.
set -euo pipefail
kernel=$1 initrd=$2 append=$3 out=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/corral-efidisk.XXXXXX")
trap 'rm -rf "$work"' EXIT

# GRUB's rescue parser runs the embedded config: no if; the marker file
# names this image's ESP (the deploy's CIDATA seed is FAT too).
cat > "$work/embedded.cfg" <<CFG
search --no-floppy --file --set=root /corral-tiny-arm64
echo "Corral test image: tiny arm64 kernel from the disk's ESP"
linux /vmlinuz $append
initrd /initrd.img
boot
CFG
grub-mkimage -O arm64-efi -d /usr/lib/grub/arm64-efi -p /EFI/BOOT -c "$work/embedded.cfg" \
  -o "$work/BOOTAA64.EFI" part_gpt fat search linux echo boot

sz=$(( ( $(stat -c %s "$kernel") + $(stat -c %s "$initrd") + $(stat -c %s "$work/BOOTAA64.EFI") ) / 1048576 + 8 ))
(( sz < 40 )) && sz=40
esp=$work/esp.img
mkfs.vfat -n ESP -C "$esp" $((sz * 1024)) >/dev/null
mmd -i "$esp" ::/EFI ::/EFI/BOOT
mcopy -i "$esp" "$work/BOOTAA64.EFI" ::/EFI/BOOT/BOOTAA64.EFI
mcopy -i "$esp" "$kernel" ::/vmlinuz
mcopy -i "$esp" "$initrd" ::/initrd.img
: > "$work/marker"
mcopy -i "$esp" "$work/marker" ::/corral-tiny-arm64

disk=$work/disk.raw
truncate -s "$((sz + 2))M" "$disk"
sfdisk -q "$disk" <<PT
label: gpt
start=1MiB, size=${sz}MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=ESP
PT
dd if="$esp" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
qemu-img convert -f raw -O qcow2 "$disk" "$out.tmp"
mv "$out.tmp" "$out"
