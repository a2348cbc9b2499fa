#!/bin/sh
# How long the Debian kernel takes to unpack Corral's initramfs images per
# compression, under QEMU TCG as in the virtual rack (bench/results/2026-11-initramfs.md).
# Prints a table, asserts nothing.
#
# The cached images (the newest build in the image cache) are decompressed
# to their cpio archive, which is recompressed as each variant. Every
# variant boots the same kernel with rdinit=/nonexistent: the kernel unpacks
# the initramfs, finds no init, mounts no root and panics; panic=-1 and
# -no-reboot end QEMU there, i.e. at the point where a real boot would exec
# /init. From the serial console's printk timestamps:
#   unpack   "Trying to unpack rootfs image as initramfs..." →
#            "Freeing initrd memory" (the unpack runs asynchronously,
#            beside the rest of the kernel's start)
#   to-init  kernel start (t=0) → the panic, i.e. when init would start
#   wall     the QEMU process, start to exit (firmware and kernel load too)
# Rounds are interleaved (A B C … A B C …); medians are printed.
#
#   sh bench/initramfs.sh                   # all variants, 3 rounds
#   RUNS=5 VARIANTS="hyp-gzip hyp-zstd" sh bench/initramfs.sh
#
# Environment: KERNEL, HYP_INITRD, DISC_INITRD (default: newest builds in
# CACHE=/var/cache/corral/discovery), RUNS (3), MEM (2048), SMP (2),
# ACCEL (tcg,thread=multi as the lab), RATE_MBS (25: HTTP fetch rate the
# lab's timelines show for the hypervisor initrd under TCG, 30.66 MB in
# 1.05-1.27 s), OUT (work directory, kept), TIMEOUT (s per boot, 240).
set -eu

CACHE=${CACHE:-/var/cache/corral/discovery}
RUNS=${RUNS:-3}
MEM=${MEM:-2048}
SMP=${SMP:-2}
ACCEL=${ACCEL:-tcg,thread=multi}
RATE_MBS=${RATE_MBS:-25}
TIMEOUT=${TIMEOUT:-240}
OUT=${OUT:-/var/tmp/corral-bench-initramfs}
ALL="hyp-gzip hyp-gzip1 hyp-gzip9 hyp-zstd hyp-zstd19 hyp-lz4 hyp-xz hyp-none
disc-xz disc-gzip disc-zstd disc-zstd19 disc-zstd22 disc-lz4 disc-none"
VARIANTS=${VARIANTS:-$ALL}

log() { printf '%s\n' "$*" >&2; }
newest() { ls -td "$@" 2>/dev/null | head -n 1; }

for t in qemu-system-x86_64 gzip xz zstd lz4 awk timeout; do
	command -v $t >/dev/null || { log "missing $t (apt-get install -y qemu-system-x86 zstd lz4 xz-utils)"; exit 1; }
done

HDIR=$(newest "$CACHE"/hypervisor/*/)
DDIR=$(newest "$CACHE"/[0-9a-f]*/)
HYP_INITRD=${HYP_INITRD:-${HDIR}initrd.img}
DISC_INITRD=${DISC_INITRD:-${DDIR}initrd.img}
KERNEL=${KERNEL:-${DDIR}vmlinuz}
for f in "$KERNEL" "$HYP_INITRD" "$DISC_INITRD"; do
	[ -f "$f" ] || { log "missing $f (build the images: make lab or corral image build)"; exit 1; }
done
mkdir -p "$OUT/img" "$OUT/log"

# The cpio archives (each image is one compressed stream).
cpio_of() { # image → raw cpio on stdout
	case $(head -c 6 "$1" | od -An -tx1 | tr -d ' \n') in
	1f8b*) gzip -dc "$1" ;;
	fd377a585a00) xz -dc "$1" ;;
	28b52ffd*) zstd -dc "$1" ;;
	02214c18*) lz4 -dc "$1" ;;
	*) cat "$1" ;;
	esac
}
[ -s "$OUT/img/hyp.cpio" ] || cpio_of "$HYP_INITRD" >"$OUT/img/hyp.cpio"
[ -s "$OUT/img/disc.cpio" ] || cpio_of "$DISC_INITRD" >"$OUT/img/disc.cpio"

# Variant images. The kernel's decompressors: xz needs --check=crc32 (the
# discovery image is built that way), lz4 the legacy frame (-l), zstd any
# ordinary frame (no --long).
build() { # variant
	v=$1 f=$OUT/img/$1.img
	[ -s "$f" ] && return 0
	src=$OUT/img/${v%%-*}.cpio
	case $v in
	hyp-gzip) # the built image was gzip before 2026-11-24 (lz4 since): recompress then
		case $(head -c 2 "$HYP_INITRD" | od -An -tx1 | tr -d ' \n') in
		1f8b) cp "$HYP_INITRD" "$f" ;;
		*) gzip -6 -n -c "$src" >"$f" ;;
		esac ;;
	disc-xz) cp "$DISC_INITRD" "$f" ;;
	hyp-built) cp "$HYP_INITRD" "$f" ;; # the image as corrald builds it today
	*-gzip) gzip -6 -n -c "$src" >"$f" ;;
	*-gzip1) gzip -1 -n -c "$src" >"$f" ;;
	*-gzip9) gzip -9 -n -c "$src" >"$f" ;;
	*-zstd) zstd -q -T0 -3 -c "$src" >"$f" ;;
	*-zstd19) zstd -q -T0 -19 -c "$src" >"$f" ;;
	*-zstd22) zstd -q -T0 --ultra -22 -c "$src" >"$f" ;;
	*-lz4) lz4 -q -l -9 -c "$src" >"$f" ;;
	*-xz) xz -T0 --check=crc32 --lzma2=dict=16MiB -9 -c "$src" >"$f" ;;
	*-none) cp "$src" "$f" ;;
	*) log "unknown variant $v"; exit 1 ;;
	esac
}
for v in $VARIANTS; do build "$v"; done

boot() { # variant round
	l=$OUT/log/$1.$2.log
	s=$(date +%s.%N)
	timeout "$TIMEOUT" qemu-system-x86_64 -machine q35 -accel "$ACCEL" -cpu max \
		-m "$MEM" -smp "$SMP" -display none -no-user-config -nodefaults -vga none \
		-serial "file:$l" -no-reboot -kernel "$KERNEL" -initrd "$OUT/img/$1.img" \
		-append "console=ttyS0 rdinit=/nonexistent panic=-1 printk.time=1" \
		</dev/null >/dev/null 2>&1 || true
	e=$(date +%s.%N)
	echo "$1 $2 $(echo "$s $e" | awk '{printf "%.2f", $2-$1}')" >>"$OUT/wall"
}

: >"$OUT/wall"
r=1
while [ $r -le "$RUNS" ]; do
	for v in $VARIANTS; do
		log "round $r/$RUNS: $v"
		boot "$v" $r
	done
	r=$((r + 1))
done

# One line per boot: variant unpack to_init wall ("-" if missing).
: >"$OUT/samples"
for v in $VARIANTS; do
	r=1
	while [ $r -le "$RUNS" ]; do
		l=$OUT/log/$v.$r.log
		w=$(awk -v v=$v -v r=$r '$1==v && $2==r {print $3}' "$OUT/wall")
		awk -v v=$v -v w="$w" '
			function ts(s) { sub(/^.*\[ */, "", s); sub(/\].*$/, "", s); return s + 0 }
			/Trying to unpack rootfs image as initramfs/ { a = ts($0) }
			/Freeing initrd memory/ { b = ts($0) }
			/Initramfs unpacking failed|junk within compressed archive|invalid magic/ { bad = 1 }
			/Kernel panic/ && !p { p = ts($0) }
			END {
				u = (a != "" && b != "" && !bad) ? sprintf("%.3f", b - a) : "-"
				printf "%s %s %s %s\n", v, u, (p != "" ? sprintf("%.3f", p) : "-"), w
			}' "$l" >>"$OUT/samples"
		r=$((r + 1))
	done
done

median() { sort -n | awk '{x[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print x[(NR + 1) / 2]; else printf "%.3f\n", (x[NR / 2] + x[NR / 2 + 1]) / 2}'; }
col() { awk -v v=$1 -v c=$2 '$1 == v && $c != "-" {print $c}' "$OUT/samples" | median; }

echo "kernel $(basename "$(dirname "$KERNEL")")/vmlinuz; hypervisor image $HYP_INITRD; discovery image $DISC_INITRD"
echo "cpio: hypervisor $(wc -c <"$OUT/img/hyp.cpio") B, discovery $(wc -c <"$OUT/img/disc.cpio") B; $RUNS rounds, accel $ACCEL, -smp $SMP -m $MEM; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %12s %9s %11s %12s %10s %10s\n' variant bytes MB unpack_s to_init_s wall_s fetch_s
for v in $VARIANTS; do
	b=$(wc -c <"$OUT/img/$v.img")
	printf '%-12s %12d %9.2f %11s %12s %10s %10.2f\n' "$v" "$b" "$(echo $b | awk '{print $1/1e6}')" \
		"$(col $v 2)" "$(col $v 3)" "$(col $v 4)" "$(echo "$b $RATE_MBS" | awk '{print $1/1e6/$2}')"
done
echo "per boot: $OUT/samples; consoles: $OUT/log/"
