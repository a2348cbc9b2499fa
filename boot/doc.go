// Package boot will own network boot: DHCP, TFTP, HTTP iPXE scripts and
// artifacts, and the IPv6 router-advertisement responder, in sub-packages.
// It must not be imported from anything reachable by cmd/corral-node.
package boot
