#!/bin/sh
# Why a lone pin/tftp transfer trails tftpd-hpa: count the server's system
# calls per data block for one 30 MiB transfer (blksize 1468, one client)
# with strace -c. Prints figures; asserts nothing.
. "$(dirname "$0")/lib.sh"
command -v strace >/dev/null || { log "missing strace"; exit 1; }
setup
files=$OUT/files
mkdir -p "$files"
head -c $((30 << 20)) /dev/urandom >"$files/snponly.efi"
cp -L /usr/lib/ipxe/undionly.kpxe "$files/undionly.kpxe"
blocks=$(((30 << 20) / 1468 + 1))
for srv in corrald pin-default tftpd-hpa; do
	case $srv in
	corrald) cmd="$BIN/tftpserve -impl corral -dir $files -listen $SERVER:69" ;;
	pin-default) cmd="$BIN/tftpserve -impl pin-default -dir $files -listen $SERVER:69" ;;
	tftpd-hpa) cmd="in.tftpd -L -s $files -a $SERVER:69" ;;
	esac
	serve strace-$srv strace -f -c -o "$OUT/strace-$srv.txt" $cmd
	client "$BIN/tftpload" -server $SERVER:69 -file snponly.efi -clients 1 -blksize 1468 -duration 1ms >/dev/null 2>&1 || true
	# strace ignores SIGTERM while tracing: stop the traced server (its
	# child, by pid), and strace exits and writes its summary.
	for c in $(cat /proc/$SPID/task/*/children 2>/dev/null); do kill $c 2>/dev/null || true; done
	unserve
	sleep 0.5
	awk -v b=$blocks -v s=$srv 'NF>=5 && $NF!="total" && $(NF-1)+0>0 && $1 ~ /^[0-9.]+$/ {calls[$NF]=$4} END {
		printf "%-11s syscalls per block:", s; t=0
		for (k in calls) if (calls[k] > b/2) { printf " %s %.2f", k, calls[k]/b; t+=calls[k] }
		printf "  (total %.2f)\n", t/b }' "$OUT/strace-$srv.txt"
done
