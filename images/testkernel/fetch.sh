#!/bin/sh
# Fetch Debian's cloud kernel (a bzImage with virtio built in) for the
# network-boot end-to-end tests (boot/e2e), into DIR (default
# /var/cache/corral/test-kernel/vmlinuz). Uses apt only; idempotent.
# Without it the tests use Debian's ipxe.lkrn as a stand-in kernel and stop
# their guest-side assertion at the kernel download.
set -eu
dir=${1:-/var/cache/corral/test-kernel}
[ -s "$dir/vmlinuz" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
chmod 755 "$tmp"
apt-get download linux-image-cloud-amd64 >/dev/null 2>&1
pkg=$(dpkg-deb -f linux-image-cloud-amd64_*.deb Depends | sed 's/[ ,(].*//')
apt-get download "$pkg" >/dev/null 2>&1
dpkg-deb -x "$pkg"_*.deb x
mkdir -p "$dir"
cp x/boot/vmlinuz-* "$dir/vmlinuz.tmp"
mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
echo "test kernel: $dir/vmlinuz ($pkg)"
