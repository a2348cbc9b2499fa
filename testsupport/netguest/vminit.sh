#!/bin/busybox sh
# /init of the VMs of the vlan scenario (QEMU guests on the test host): load
# the virtio NIC, take the address named by netguest.ip= on the kernel
# command line and ping each of netguest.peers= (comma-separated) once a
# second for ever, printing one line per ping.
B=/bin/busybox
echo "VMINIT"
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net; do
	$B insmod /modules/$m.ko
done
ip=$($B sed -n 's/.*netguest\.ip=\([0-9./]*\).*/\1/p' /proc/cmdline)
peers=$($B sed -n 's/.*netguest\.peers=\([0-9.,]*\).*/\1/p' /proc/cmdline | $B tr , ' ')
n=0
while ! $B ip link show eth0 >/dev/null 2>&1 && [ $n -lt 100 ]; do $B sleep 0.2; n=$((n+1)); done
$B ip link set lo up
$B ip addr add "$ip" dev eth0
$B ip link set eth0 up
echo "VMUP $ip"
while true; do
	for p in $peers; do
		if $B ping -c 1 -W 1 "$p" >/dev/null 2>&1; then echo "VMPING $p ok"; else echo "VMPING $p fail"; fi
	done
	$B sleep 1
done
