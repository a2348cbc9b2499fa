#!/bin/sh
# The OS-image deploy benchmark (bench/README.md, "OS-image deploy and
# erase"): builds corrald and bench/deploy, makes a 2 GiB mostly empty raw
# image, uploads it through the built corrald's API, then, each comparison
# interleaved run by run (bench/deploy):
#   serve  corrald's /os-images/<sha256>/raw against nginx serving the same
#          stored file to 10 concurrent deploys (extents by Range, as the
#          agent fetches them, also from the image uploaded as qcow2, and
#          whole-file GETs);
#   write  the agent's writer (agent/diskwrite) against bmaptool copy,
#          to one loop device;
#   erase  agent/erase quick and full on that loop device (discard) and
#          full on a twin with discard off (zeroing), secure refused.
# Everything listens on loopback only; servers are pinned to SERVER_CPU,
# the clients and writers to CLIENT_CPU. Root (loop devices). Prints
# figures, asserts nothing.
#
# Knobs: SIZE (bytes, 2 GiB), DATA (256 MiB), CLIENTS (10), RUNS (5),
# WHOLE_RUNS (3), ERASE_RUNS (3), BENCH_DIR, KEEP=1 keeps BENCH_DIR.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${BENCH_DIR:-/var/tmp/corral-bench-deploy-$$}
SIZE=${SIZE:-2147483648}
DATA=${DATA:-268435456}
CLIENTS=${CLIENTS:-10}
RUNS=${RUNS:-5}
WHOLE_RUNS=${WHOLE_RUNS:-3}
ERASE_RUNS=${ERASE_RUNS:-3}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
API=127.0.0.1:${API_PORT:-28443}
CHTTP=127.0.0.1:${CORRALD_HTTP_PORT:-28080}
NHTTP=127.0.0.1:${NGINX_PORT:-28081}
PIDS=""
LOOP=""
ZLOOP=""

log() { printf '%s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "run as root (loop devices)"; exit 1; }
for t in go nginx bmaptool losetup blkdiscard taskset curl qemu-img; do
	command -v $t >/dev/null || { log "missing $t (Debian packages: nginx, bmap-tools, util-linux, curl, qemu-utils)"; exit 1; }
done

teardown() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	[ -z "$LOOP" ] || losetup -d "$LOOP" 2>/dev/null || true
	# The erase bench turned the twin's discard off, which this kernel
	# will not turn back on: give the loop device back as the kernel
	# makes it.
	if [ -n "$ZLOOP" ]; then
		losetup -d "$ZLOOP" 2>/dev/null || true
		"$OUT/bin/deploy" loopreset -device "$ZLOOP" || log "could not reset $ZLOOP: its discard stays off until it is removed"
	fi
	[ -n "${KEEP:-}" ] || rm -rf "$OUT"
}
trap teardown EXIT
trap "exit 1" HUP INT PIPE TERM

mkdir -p "$OUT/bin" "$OUT/img" "$OUT/nginx"
(cd "$REPO" && go build -o "$OUT/bin/" ./cmd/corrald ./bench/deploy)
B=$OUT/bin/deploy
client() { taskset -c "$CLIENT_CPU" "$@"; }

echo "deploy bench: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(cd "$REPO" && git rev-parse --short HEAD), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$B" image -out "$OUT/img/disk.raw" -size "$SIZE" -data "$DATA"

taskset -c "$SERVER_CPU" "$OUT/bin/corrald" serve --data-dir "$OUT/corrald" --api-listen "$API" \
	--boot-interface lo --dhcp-mode off --no-ra --tftp-listen off --http-listen "$CHTTP" \
	--allow-test-images >"$OUT/corrald.log" 2>&1 &
PIDS="$PIDS $!"
i=0
until grep -q "serving boot HTTP" "$OUT/corrald.log" 2>/dev/null && [ -f "$OUT/corrald/admin.conf" ]; do
	i=$((i + 1))
	[ $i -lt 600 ] || { log "corrald did not start:"; tail -20 "$OUT/corrald.log" >&2; exit 1; }
	sleep 0.1
done
SUM=$("$B" upload -conf "$OUT/corrald/admin.conf" -name bench-2g -file "$OUT/img/disk.raw")
STORED=$(find "$OUT/corrald" -type f -name "$SUM" | head -1)
[ -n "$STORED" ] || { log "the uploaded content $SUM is not under $OUT/corrald"; exit 1; }
echo "stored: $STORED ($(du -m "$STORED" | cut -f1) MiB on disk)"

# nginx serves the file corrald stored (the same inode), one worker,
# sendfile on, as Debian ships it otherwise.
ln -s "$STORED" "$OUT/nginx/disk.raw"
cat >"$OUT/nginx/nginx.conf" <<CONF
user root;
worker_processes 1;
daemon off;
pid $OUT/nginx/nginx.pid;
error_log $OUT/nginx/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  default_type application/octet-stream;
  server {
    listen $NHTTP;
    root $OUT/nginx;
  }
}
CONF
taskset -c "$SERVER_CPU" nginx -c "$OUT/nginx/nginx.conf" >"$OUT/nginx/stdout.log" 2>&1 &
PIDS="$PIDS $!"
sleep 1
CURL_RANGE="-s -o /dev/null -w %{http_code} -r 0-1023"
for u in "http://$CHTTP/os-images/$SUM/raw" "http://$NHTTP/disk.raw"; do
	code=$(curl $CURL_RANGE "$u")
	[ "$code" = 206 ] || { log "$u answers a Range GET with $code, want 206"; tail -5 "$OUT/corrald.log" "$OUT/nginx/error.log" >&2; exit 1; }
done

# The same image uploaded as qcow2: corrald converts it as it serves the
# raw view (no sendfile), as for the rack's Debian image.
qemu-img convert -f raw -O qcow2 "$OUT/img/disk.raw" "$OUT/img/disk.qcow2"
QSUM=$("$B" upload -conf "$OUT/corrald/admin.conf" -name bench-2g-qcow2 -format qcow2 -file "$OUT/img/disk.qcow2")
code=$(curl $CURL_RANGE "http://$CHTTP/os-images/$QSUM/raw")
[ "$code" = 206 ] || { log "the qcow2 image's raw view answers a Range GET with $code, want 206"; exit 1; }

echo
client "$B" serve -map "$OUT/img/disk.raw.map.json" -clients "$CLIENTS" -runs "$RUNS" -mode extents \
	-url "corrald=http://$CHTTP/os-images/$SUM/raw" -url "corrald-qcow2=http://$CHTTP/os-images/$QSUM/raw" \
	-url "nginx=http://$NHTTP/disk.raw"
echo
client "$B" serve -map "$OUT/img/disk.raw.map.json" -clients "$CLIENTS" -runs "$WHOLE_RUNS" -mode whole \
	-url "corrald=http://$CHTTP/os-images/$SUM/raw" -url "nginx=http://$NHTTP/disk.raw"

# The target: a loop device over a sparse file on the same filesystem.
bmaptool create -o "$OUT/img/disk.bmap" "$OUT/img/disk.raw" 2>"$OUT/bmaptool-create.log"
truncate -s "$SIZE" "$OUT/img/target"
LOOP=$(losetup -f --show "$OUT/img/target")
echo
client "$B" write -map "$OUT/img/disk.raw.map.json" -image "$OUT/img/disk.raw" -bmap "$OUT/img/disk.bmap" \
	-url "http://$CHTTP/os-images/$SUM/raw" -device "$LOOP" -runs "$RUNS"
echo
truncate -s "$SIZE" "$OUT/img/twin"
ZLOOP=$(losetup -f --show "$OUT/img/twin")
client "$B" erase -device "$LOOP" -zero-device "$ZLOOP" -runs "$ERASE_RUNS"
echo
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
