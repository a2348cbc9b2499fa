#!/bin/sh
# TFTP benchmark: 1 and 16 concurrent clients fetching ipxe.efi and a
# 30 MiB file with blksize 512 and 1468, against corrald's boot/tftp (as
# corrald runs it), pin/tftp with its defaults (file read per block), and
# tftpd-hpa. Server pinned to one core; prints MB/s and server CPU per
# block (busy time of the server's CPU: tftpd-hpa forks per transfer).
# Asserts nothing.
# Usage: bench/tftp.sh [servers...]   (default: corrald pin-default tftpd-hpa)
. "$(dirname "$0")/lib.sh"
DURATION=${DURATION:-8s}
SERVERS=${*:-corrald pin-default tftpd-hpa}
command -v in.tftpd >/dev/null || { log "missing in.tftpd (Debian package tftpd-hpa)"; exit 1; }
setup
files=$OUT/files
mkdir -p "$files"
src=/usr/lib/ipxe/ipxe.efi
[ -r $src ] || { log "missing $src (Debian package ipxe)"; exit 1; }
cp -L $src "$files/ipxe.efi"
# The 30 MiB file is served under a catalog iPXE name so that corrald's
# server (which serves only iPXE binaries) will send it.
head -c $((30 << 20)) /dev/urandom >"$files/snponly.efi"
cp -L /usr/lib/ipxe/undionly.kpxe "$files/undionly.kpxe"

start() {
	case $1 in
	corrald) serve tftp-corrald "$BIN/tftpserve" -impl corral -dir "$files" -listen $SERVER:69 ;;
	pin-default) serve tftp-pin "$BIN/tftpserve" -impl pin-default -dir "$files" -listen $SERVER:69 ;;
	tftpd-hpa) serve tftpd-hpa in.tftpd -L -s "$files" -a $SERVER:69 -B 1468 ;;
	esac
}

echo "== TFTP: server pinned to CPU $SERVER_CPU, $DURATION per case =="
for file in ipxe.efi snponly.efi; do
	for blk in 512 1468; do
		for n in 1 16; do
			for srv in $SERVERS; do
				start $srv
				t0=$(cpu_busy $SERVER_CPU)
				out=$(client "$BIN/tftpload" -server $SERVER:69 -file $file -clients $n -blksize $blk -duration $DURATION 2>&1 || true)
				t1=$(cpu_busy $SERVER_CPU)
				unserve
				mbs=$(echo "$out" | awk '{for (i=1;i<=NF;i++) if ($i=="MB/s,") print $(i-1)}')
				blocks=$(echo "$out" | awk '{for (i=1;i<=NF;i++) if ($i=="blocks") print $(i-1)}')
				cpb=$(awk -v t=$((t1 - t0)) -v b="${blocks:-0}" 'BEGIN{ if (b>0) printf "%.1f", t*10000/b; else print "-" }')
				label=$file
				[ $file = snponly.efi ] && label="30MiB"
				printf '%-9s %-11s blksize %4d clients %2d: %7s MB/s, server CPU %5s us/block\n' "$label" $srv $blk $n "${mbs:-0}" "$cpb"
				echo "$label $blk $n $srv ${mbs:-0}" >>"$OUT/tftp.results"
			done
		done
	done
done
echo
echo "== ratios corrald/tftpd-hpa and pin-default/tftpd-hpa =="
awk '{v[$1" "$2" "$3" "$4]=$5; k[$1" "$2" "$3]=1}
	END { for (x in k) { h=v[x" tftpd-hpa"]; if (h>0) printf "%-22s corrald %.2fx  pin-default %.2fx\n", x, v[x" corrald"]/h, v[x" pin-default"]/h } }' "$OUT/tftp.results" | sort
