#!/usr/bin/env bash
# cloudimg.sh OUT.qcow2 — a Debian bookworm guest with the real cloud-init
# inside: an mmdebstrap rootfs (cloud kernel, systemd, cloud-init,
# openssh-server, ifupdown, mdadm) on an ext4 partition, and a FAT boot partition
# holding the kernel and initramfs that boots both ways: SYSLINUX for BIOS
# (MBR boot code, active partition) and systemd-boot for UEFI (the
# partition's type is 0xEF, the EFI system partition, with
# \EFI\BOOT\BOOTX64.EFI). Built without loop devices or mounts
# (mkfs.ext4 -d, mtools, syslinux --install on a file).
#
# mdadm is in the rootfs so that its initramfs assembles software RAID:
# the agent may write this root filesystem onto an md array
# (docs/operator-guide.md, "Disk layouts"); the kernel finds it by
# root=LABEL=root on the array (its members show as linux_raid_member,
# not as the filesystem, so the label names the array alone). The
# initramfs is made without an mdadm.conf naming arrays (there are none
# at build time): arrays created with --homehost=any are assembled on
# any host.
#
# Needs: mmdebstrap syslinux syslinux-common mtools dosfstools fdisk
# e2fsprogs qemu-utils. Env: CORRAL_DEBIAN_MIRROR (default
# http://deb.debian.org/debian).
set -euo pipefail
out=$1
mirror=${CORRAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${TMPDIR:-/tmp}/corral-cloudimg.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

mmdebstrap --variant=minbase --mode=root \
  --include=linux-image-cloud-amd64,initramfs-tools,systemd-boot-efi,systemd-sysv,udev,mdadm,cloud-init,openssh-server,ifupdown,iproute2,iputils-ping,sudo,netbase,procps \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --customize-hook='echo "datasource_list: [ NoCloud, None ]" > "$1/etc/cloud/cloud.cfg.d/90-corral.cfg"' \
  --customize-hook='printf "LABEL=root / ext4 defaults 0 1\n" > "$1/etc/fstab"' \
  --customize-hook='printf "auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n" > "$1/etc/network/interfaces"' \
  --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*; : > "$1/etc/machine-id"; echo debian > "$1/etc/hostname"' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm "$root" "$mirror"

kernel=$(ls "$root"/boot/vmlinuz-* | head -1)
initrd=$(ls "$root"/boot/initrd.img-* | head -1)

# Boot partition: FAT16, SYSLINUX (BIOS), systemd-boot (UEFI), kernel,
# initramfs. Both loaders boot the same kernel with the same command line.
boot=$work/boot.img
bootmib=96
mkfs.vfat -n BOOT -C "$boot" $((bootmib * 1024)) >/dev/null
cat > "$work/syslinux.cfg" <<CFG
SERIAL 0 115200
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=LABEL=root ro console=tty0 console=ttyS0,115200 net.ifnames=0
CFG
mcopy -i "$boot" "$kernel" ::/vmlinuz
mcopy -i "$boot" "$initrd" ::/initrd.img
mcopy -i "$boot" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$boot"
cmdline="root=LABEL=root ro console=tty0 console=ttyS0,115200 net.ifnames=0"
printf 'timeout 0\ndefault debian.conf\n' > "$work/loader.conf"
printf 'title Debian\nlinux /vmlinuz\ninitrd /initrd.img\noptions %s\n' "$cmdline" > "$work/debian.conf"
mmd -i "$boot" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
mcopy -i "$boot" "$root/usr/lib/systemd/boot/efi/systemd-bootx64.efi" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$boot" "$work/loader.conf" ::/loader/loader.conf
mcopy -i "$boot" "$work/debian.conf" ::/loader/entries/debian.conf

# Root partition: ext4 filled from the directory.
rootmib=$(( $(du -sm "$root" | cut -f1) * 13 / 10 + 256 ))
rootimg=$work/root.img
mkfs.ext4 -q -L root -d "$root" "$rootimg" "${rootmib}M"

# Disk: MBR with SYSLINUX's boot code, partition 1 FAT (active, type EF:
# the EFI system partition), 2 ext4.
disk=$work/disk.raw
total=$(( 1 + bootmib + rootmib + 1 ))
truncate -s "${total}M" "$disk"
sfdisk -q "$disk" <<PT
label: dos
start=1MiB, size=${bootmib}MiB, type=ef, bootable
start=$((1 + bootmib))MiB, size=${rootmib}MiB, type=83
PT
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$boot" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$rootimg" of="$disk" bs=1M seek=$((1 + bootmib)) conv=notrunc,sparse status=none
qemu-img convert -f raw -O qcow2 "$disk" "$out.tmp"
mv "$out.tmp" "$out"
