#!/bin/sh
# Where the seconds of the discovery image's kexec into the hypervisor
# image go under QEMU TCG (issue #14), outside the virtual rack: QEMU (as
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
# TIMEOUT (s per boot, 300), EXTRA (appended to the next kernel's line).
set -eu
cd "$(dirname "$0")/.."

CACHE=${CACHE:-/var/cache/corral/discovery}
RUNS=${RUNS:-3}
TIMEOUT=${TIMEOUT:-300}
OUT=${OUT:-/var/tmp/corral-bench-kexec}
VARIANTS=${VARIANTS:-file segments direct}
EXTRA=${EXTRA:-}

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
	v=$1 f=$OUT/log/$1-$2.log
	set -- qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 2560 -machine pc \
		-display none -no-user-config -nodefaults -vga none -no-reboot -serial stdio
	case $v in
	direct) set -- "$@" -kernel "$KERNEL" -initrd "$HYP_INITRD" -append "$NEXT" ;;
	*) set -- "$@" -kernel "$KERNEL" -initrd "$OUT/guest.cpio" -append "console=ttyS0,115200n8 kb.method=$v" ;;
	esac
	timeout "$TIMEOUT" "$@" </dev/null 2>&1 | ts -s '%.s' >"$f" || true
}

# Seconds from a reference line to each mark (first match of each; for
# the kexec variants the marks are searched after "kb: loaded").
marks() { # log
	awk '
	function at(s) { return substr($1, 1) + 0 }
	/kb: files in memfds/ && !m0 { m0 = at(); next }
	/kb: loaded in/ && !m1 { m1 = at(); split($0, a, "loaded in "); ld = a[2]; kx = 1; next }
	kx == 0 && direct == 0 && /Linux version/ && !d0 { d0 = at() }
	(kx || !m0) && /Decompressing Linux/ && !dc { dc = at() }
	(kx || !m0) && /Booting the kernel/ && !bk { bk = at() }
	(kx || !m0) && /Linux version/ && !lv { lv = at() }
	(kx || !m0) && /Trying to unpack rootfs/ && !tu { tu = at() }
	(kx || !m0) && /Freeing initrd memory/ && !fi { fi = at() }
	(kx || !m0) && /Kernel panic/ && !kp { kp = at() }
	END {
		if (m0) { t0 = m1 } else { t0 = 0 }
		printf "load %.2f  decompress-start %.2f  decompress %.2f  to-first-printk %.2f  unpack %.2f  to-init %.2f  total %.2f\n",
			(m0 ? m1 - m0 : 0), dc - t0, bk - dc, lv - t0, fi - tu, kp - t0, kp - t0
	}' "$1"
}

i=1
while [ "$i" -le "$RUNS" ]; do
	for v in $VARIANTS; do
		log "round $i: $v (load $(cut -d' ' -f1-3 /proc/loadavg))"
		boot "$v" "$i"
		printf '%s %s %s\n' "$v" "$i" "$(marks "$OUT/log/$v-$i.log")" | tee -a "$OUT/results"
	done
	i=$((i + 1))
done
