// Package lab is the virtual rack behind corral-lab: a network namespace
// with a bridge, corrald serving full DHCP on it, and QEMU machines (TCG,
// BIOS or UEFI firmware, SMBIOS and disk serials) each optionally behind
// its own OpenIPMI ipmi_sim BMC. Up builds what is missing and starts it
// all detached, recording every process, link and port in a state file;
// Status and Report read the appliance's API; Down stops exactly what the
// state file names and removes the namespace and links.
//
// With Config.Appliances ≥ 2 the lab is a fleet (fleet.go): a three-member
// etcd cluster as local processes in the namespace, and N corrald on
// --store etcd (lab-a1, lab-a2, ...), each on its own veth into the bridge
// with its own address and API port. lab-a1 initialises the fleet and its
// cluster key is copied to the others. Only lab-a1 serves DHCP (full) and
// TFTP, unless Config.ApplianceDHCP is DHCPAll: then every appliance serves
// full DHCP from the one range (leases are compare-and-swapped in etcd),
// which keeps the segment booting when any one appliance dies. Every
// appliance serves HTTP boot and the whole API.
//
// It drives the real binaries (corrald, corral, ip, qemu-system-x86_64,
// ipmi_sim) and talks gRPC to corrald; it must not be imported by corrald,
// corral or corral-node.
package lab
