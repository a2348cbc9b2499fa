// Package lldp hears a machine's LLDP neighbours (IEEE 802.1AB, ethertype
// 0x88cc, sent to 01:80:c2:00:00:0e) during discovery: Listen opens one
// raw socket per NIC (mdlayher/packet) for a bounded window and Decode
// turns a frame into a Neighbor with gopacket's LLDP layer. Everything a
// frame holds is the sender's word: strings are capped at MaxString bytes,
// made valid UTF-8 and escaped (internal/termsafe), and at most
// MaxNeighbors are kept per NIC. It runs on the machine, in the discovery
// image: it must not import store/, boot/, ipmi/, bbolt, etcd or bmclib.
package lldp
