// Package boot owns network boot, in sub-packages: dhcp (full, proxy and
// relayed DHCPv4), tftp (first-stage iPXE binaries), http (iPXE scripts and
// artifacts) and ra (IPv6 router-advertisement responder). See README.md.
// It must not be imported from anything reachable by cmd/corral-node.
package boot
