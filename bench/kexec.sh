#!/bin/sh
# Where the seconds of the discovery image's kexec into the hypervisor
# image go under QEMU TCG (bench/results/2026-11-lab.md), outside the virtual rack: QEMU (as
# the lab runs a BIOS machine: TCG, -cpu max, 2 vCPUs, 2560 MiB, pc)
# boots the discovery kernel with a small initramfs whose init
# (bench/kexec) holds the hypervisor kernel and initrd in memfds as the
# agent does, loads them by the method under test and reboots into them.
# The next kernel gets the hypervisor boot's command line plus
# earlyprintk (its decompressor and first printk show) and
# rdinit=/nonexistent panic=-1: it unpacks the initramfs, finds no init,
# panics and QEMU (-no-reboot) exits, i.e. where /init would start. The
# host stamps every console line with the wall clock (moreutils ts).
#
# Variants (interleaved A B C … A B C …, medians printed):
#   file      kexec_file_load(2) (u-root kexec.FileLoad; the agent before)
#   segments  kexec_load(2) + u-root's non-hashing purgatory (agent/kexec
#             SegmentsLoad; the agent now)
#   direct    QEMU boots the hypervisor kernel + initrd itself (no kexec)
#
#   sh bench/kexec.sh                  # all variants, RUNS=3
#   RUNS=5 VARIANTS="file segments" sh bench/kexec.sh
#
# Environment: KERNEL, HYP_INITRD (default: newest builds in
# CACHE=/var/cache/corral/discovery), RUNS, OUT (work dir, kept),
# TIMEOUT (s per boot, 300), EXTRA (appended to the next kernel's line),
# GUEST (appended to the first kernel's line: e.g. GODEBUG=cpu.avx2=off
# reaches the init's environment), FW (bios, or uefi: q35 + OVMF as the lab's UEFI machine, which boots the
# discovery kernel through its EFI stub).
set -eu
cd "$(dirname "$0")/.."

CACHE=${CACHE:-/var/cache/corral/discovery}
RUNS=${RUNS:-3}
TIMEOUT=${TIMEOUT:-300}
OUT=${OUT:-/var/tmp/corral-bench-kexec}
VARIANTS=${VARIANTS:-file segments direct}
EXTRA=${EXTRA:-}
FW=${FW:-bios}
GUEST=${GUEST:-}

log() { printf '%s\n' "$*" >&2; }
newest() { ls -td "$@" 2>/dev/null | head -n 1; }
for t in qemu-system-x86_64 ts go awk timeout; do
	command -v $t >/dev/null || { log "missing $t (apt-get install -y qemu-system-x86 moreutils)"; exit 1; }
done
HDIR=$(newest "$CACHE"/hypervisor/*/)
HYP_INITRD=${HYP_INITRD:-${HDIR}initrd.img}
KERNEL=${KERNEL:-${HDIR}vmlinuz}
mkdir -p "$OUT/log"

NEXT="initrd=hypervisor-initrd.img corral.endpoint=10.0.0.1:20180 corral.token=none corral.ca=0000000000000000000000000000000000000000000000000000000000000000 corral.mac=52:54:00:00:00:01 corral.mode=hypervisor console=tty0 console=ttyS0,115200n8 earlyprintk=serial,ttyS0,115200 rdinit=/nonexistent panic=-1 $EXTRA"
CGO_ENABLED=0 go build -o "$OUT/init" ./bench/kexec
printf '%s\n' "$NEXT" >"$OUT/next-cmdline"
"$OUT/init" cpio "$OUT/guest.cpio" init="$OUT/init" vmlinuz="$KERNEL" hyp.img="$HYP_INITRD" next-cmdline="$OUT/next-cmdline"

boot() { # variant run
	v=$1 f=$OUT/log/$FW-$1-$2.log
	set -- qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 2560 \
		-display none -no-user-config -nodefaults -vga none -no-reboot -serial stdio
	case $FW in
	uefi)
		cp /usr/share/OVMF/OVMF_VARS_4M.fd "$OUT/vars.fd"
		set -- "$@" -machine q35 -drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd \
			-drive if=pflash,format=raw,unit=1,file="$OUT/vars.fd" ;;
	*) set -- "$@" -machine pc ;;
	esac
	case $v in
	direct) set -- "$@" -kernel "$KERNEL" -initrd "$HYP_INITRD" -append "$NEXT" ;;
	*) set -- "$@" -kernel "$KERNEL" -initrd "$OUT/guest.cpio" -append "console=ttyS0,115200n8 kb.method=$v $GUEST" ;;
	esac
	timeout "$TIMEOUT" "$@" </dev/null 2>&1 | ts -s '%.s' >"$f" || true
}

# Seconds between the console's marks: load (files in memfds → loaded),
# reboot (kexec_core "Starting new kernel" → the next kernel's first
# printk: the reboot path, the purgatory, the decompressor), kernel (→
# "Trying to unpack rootfs"), unpack (→ "Freeing initrd memory"), rest (→
# the panic, where /init would run) and total (memfds → panic). direct
# has no load or reboot: its kernel counts from QEMU's start.
marks() { # log
	awk '
	/kb: hashed/ && !a { a = $1 }
	/kb: loaded in/ && !b { b = $1 }
	/Starting new kernel/ && !c { c = $1 }
	/Linux version/ { d = $1 }
	/Trying to unpack rootfs/ { e = $1 }
	/Freeing initrd memory/ { g = $1 }
	/Kernel panic/ && !h { h = $1 }
	END {
		if (!a) { a = b = c = 0 }
		if (!h) { print "no panic: see the log"; exit }
		printf "load %.2f reboot %.2f kernel %.2f unpack %.2f rest %.2f total %.2f\n", b - a, d - c, e - d, g - e, h - g, h - a
	}' "$1"
}

i=1
while [ "$i" -le "$RUNS" ]; do
	for v in $VARIANTS; do
		log "round $i: $v (load $(cut -d' ' -f1-3 /proc/loadavg))"
		boot "$v" "$i"
		printf '%s %s %s %s\n' "$FW" "$v" "$i" "$(marks "$OUT/log/$FW-$v-$i.log")" | tee -a "$OUT/results"
	done
	i=$((i + 1))
done
