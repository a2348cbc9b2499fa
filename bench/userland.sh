#!/bin/sh
# The boot-time userland of the discovery and hypervisor images (u-root
# init, corral-node's coldplug, DHCP, facts / mount) under QEMU TCG,
# outside the virtual rack (bench/results/2026-11-lab.md): QEMU as the lab runs a machine
# (TCG, -cpu max, 2 vCPUs, 2560 MiB; pc, or FW=uefi: q35 + OVMF; a virtio
# NIC on user-mode networking, whose DHCP server answers; two virtio disks;
# an IPMI BT interface with QEMU's internal BMC) boots the cached image's
# kernel and initramfs directly, with corral-node built from each source
# tree under test appended as the init's uinit (an uncompressed cpio
# after the image: the kernel unpacks both; the hypervisor image's lz4 is
# unpacked to a cpio first, since the kernel stops at the end of a legacy
# lz4 stream). The host stamps every console line (moreutils ts).
#
# Marks per boot (seconds): init (`Run /init` → the agent's first line:
# u-root's init and the agent's Go start), lease (→ the boot NIC's DHCP
# lease: coldplug and DHCP), then discovery: facts (→ facts collected),
# hypervisor: disk (→ the data partition stage's first attempt, which
# fails: the disks are blank) and total from `Run /init`.
#
#   A=/path/to/old/tree B=. sh bench/userland.sh      # RUNS=3, IMG=disc
#   IMG=hyp FW=uefi A=... B=... sh bench/userland.sh
#
# Environment: A, B (source trees; B alone runs one variant), IMG (disc or
# hyp), FW (bios or uefi), RUNS (3), CACHE (/var/cache/corral/discovery:
# the newest image of each kind), OUT (/var/tmp/corral-bench-userland),
# TIMEOUT (s per boot, 40), EXTRA (appended to the kernel command line).
set -eu
cd "$(dirname "$0")/.."

CACHE=${CACHE:-/var/cache/corral/discovery}
RUNS=${RUNS:-3}
IMG=${IMG:-disc}
FW=${FW:-bios}
OUT=${OUT:-/var/tmp/corral-bench-userland}
TIMEOUT=${TIMEOUT:-40}
EXTRA=${EXTRA:-}
B=${B:-.}
A=${A:-}

log() { printf '%s\n' "$*" >&2; }
newest() { ls -td "$@" 2>/dev/null | head -n 1; }
for t in qemu-system-x86_64 ts go awk timeout lz4; do
	command -v $t >/dev/null || { log "missing $t (apt-get install -y qemu-system-x86 moreutils lz4)"; exit 1; }
done
mkdir -p "$OUT/log"
case $IMG in
disc)
	D=$(newest "$CACHE"/*/initrd.img)
	D=${D%initrd.img}
	cp "${D}initrd.img" "$OUT/base-disc.img"
	TAGS=-tags=corral_discovery MODE=discover ;;
hyp)
	D=$(newest "$CACHE"/hypervisor/*/)
	lz4 -dc "${D}initrd.img" >"$OUT/base-hyp.img"
	TAGS= MODE=hypervisor ;;
*) log "IMG=$IMG: want disc or hyp"; exit 2 ;;
esac
KERNEL=${D}vmlinuz
CGO_ENABLED=0 go build -o "$OUT/cpio" ./bench/kexec
VARIANTS=
for v in A B; do
	eval src=\$$v
	[ -n "$src" ] || continue
	(cd "$src" && CGO_ENABLED=0 go build $TAGS -ldflags="-s -w" -o "$OUT/agent-$v" ./cmd/corral-node)
	"$OUT/cpio" cpio "$OUT/ovl-$v.cpio" bin/uinit="$OUT/agent-$v"
	cat "$OUT/base-$IMG.img" "$OUT/ovl-$v.cpio" >"$OUT/initrd-$IMG-$v.img"
	VARIANTS="$VARIANTS $v"
done
truncate -s 1G "$OUT/disk-a.raw" "$OUT/disk-b.raw"
CMDLINE="initrd=initrd.img corral.endpoint=10.0.2.2:20180 corral.token=none corral.ca=0000000000000000000000000000000000000000000000000000000000000000 corral.mac=52:54:00:00:00:01 corral.mode=$MODE console=tty0 console=ttyS0,115200n8 $EXTRA"

boot() { # variant run
	f=$OUT/log/$IMG-$FW-$1-$2.log
	set -- qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 2560 \
		-display none -no-user-config -nodefaults -vga none -serial stdio \
		-netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile= \
		-drive if=none,id=d0,format=raw,file="$OUT/disk-a.raw" -device virtio-blk-pci,drive=d0,serial=DISK-A \
		-drive if=none,id=d1,format=raw,file="$OUT/disk-b.raw" -device virtio-blk-pci,drive=d1,serial=DISK-B \
		-device ipmi-bmc-sim,id=bmc0 -device isa-ipmi-bt,bmc=bmc0 \
		-kernel "$KERNEL" -initrd "$OUT/initrd-$IMG-$1.img" -append "$CMDLINE"
	case $FW in
	uefi)
		cp /usr/share/OVMF/OVMF_VARS_4M.fd "$OUT/vars.fd"
		set -- "$@" -machine q35 -drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd \
			-drive if=pflash,format=raw,unit=1,file="$OUT/vars.fd" ;;
	*) set -- "$@" -machine pc ;;
	esac
	timeout "$TIMEOUT" "$@" </dev/null 2>&1 | ts -s '%.s' >"$f" || true
}

marks() { # log
	awk '
	/Run \/init as init process/ && !a { a = $1 }
	/corral: (discovery agent|hypervisor boot)/ && !b { b = $1 }
	/corral: [a-z0-9]+ has [0-9]/ && !d { d = $1 }
	/facts collected/ && !e { e = $1 }
	/corral: data disk \(attempt 1\)/ && !e { e = $1 }
	END {
		if (!a || !b || !d || !e) { print "marks missing: see the log"; exit }
		printf "init %.2f lease %.2f %s %.2f total %.2f\n", b - a, d - b, (IMG == "disc" ? "facts" : "disk"), e - d, e - a
	}' IMG="$IMG" "$1"
}

i=1
while [ "$i" -le "$RUNS" ]; do
	for v in $VARIANTS; do
		log "round $i: $v (load $(cut -d' ' -f1-3 /proc/loadavg))"
		boot "$v" "$i"
		printf '%s %s %s %s load %s\n' "$IMG-$FW" "$v" "$i" "$(marks "$OUT/log/$IMG-$FW-$v-$i.log")" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/results"
	done
	i=$((i + 1))
done
