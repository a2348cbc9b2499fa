#!/bin/sh
# HTTP benchmark: 16 clients fetching the initramfs (a 30 MiB file) from
# corrald's boot/http (corrald itself, DHCP off) and from nginx (sendfile
# on, one worker). Server pinned to one core; prints MB/s and the ratio.
# Asserts nothing.
. "$(dirname "$0")/lib.sh"
DURATION=${DURATION:-10s}
CLIENTS=${CLIENTS:-16}
command -v nginx >/dev/null || { log "missing nginx (Debian package nginx-light)"; exit 1; }
setup
files=$OUT/files
mkdir -p "$files"
head -c $((30 << 20)) /dev/urandom >"$files/initrd.img"
cat >"$OUT/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/nginx.err;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  server { listen $SERVER:8080; root $files; location /images/ { alias $files/; } }
}
CONF
echo "== HTTP: $CLIENTS clients, 30 MiB initramfs, $DURATION, server pinned to CPU $SERVER_CPU =="
serve corrald "$BIN/corrald" serve --data-dir "$OUT/state" --api-listen 127.0.0.1:20180 --boot-interface $IF_S \
	--dhcp-mode off --tftp-listen off --no-ra --http-listen $SERVER:8080 --boot-initrd "$files/initrd.img" --log-level warn \
	--http-max-conns-per-ip $((CLIENTS + 16)) --http-max-conns $((CLIENTS + 64))
t0=$(ticks $SPID)
c=$(client "$BIN/httpload" -url http://$SERVER:8080/images/initrd.img -clients $CLIENTS -duration $DURATION)
t1=$(ticks $SPID)
unserve
echo "corrald  $c  (server CPU $((t1 - t0)) ticks)"
serve nginx nginx -c "$OUT/nginx.conf"
t0=$(ticks $SPID)
n=$(client "$BIN/httpload" -url http://$SERVER:8080/images/initrd.img -clients $CLIENTS -duration $DURATION)
t1=$(ticks $SPID)
unserve
echo "nginx    $n  (server CPU $((t1 - t0)) ticks, master only: the worker is a child)"
a=$(echo "$c" | awk '{print $3}')
b=$(echo "$n" | awk '{print $3}')
awk -v a="$a" -v b="$b" 'BEGIN{ if (b>0) printf "ratio corrald/nginx %.2f\n", a/b }'
