// Package lab is the virtual rack behind corral-lab: a network namespace
// with a bridge, corrald serving full DHCP on it, and QEMU machines (TCG,
// BIOS or UEFI firmware, SMBIOS and disk serials) each optionally behind
// its own OpenIPMI ipmi_sim BMC. Up builds what is missing and starts it
// all detached, recording every process, link and port in a state file;
// Status and Report read the appliance's API; Down stops exactly what the
// state file names and removes the namespace and links.
//
// It drives the real binaries (corrald, corral, ip, qemu-system-x86_64,
// ipmi_sim) and talks gRPC to corrald; it must not be imported by corrald,
// corral or corral-node.
package lab
