package dhcp

import (
	"encoding/binary"
	"net"
	"slices"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// appendPacket appends d's wire form to b: byte for byte what
// dhcpv4.(*DHCPv4).ToBytes returns (fields, magic cookie, options in code
// order with option 82 last, options over 255 bytes split, End, padding
// to the BOOTP minimum of 300 bytes), without its growing buffers and
// sorted-key slice. Addresses that are not IPv4 are written as zeros.
func appendPacket(b []byte, d *dhcpv4.DHCPv4) []byte {
	start := len(b)
	b = append(b, byte(d.OpCode), byte(d.HWType), byte(len(d.ClientHWAddr)), d.HopCount)
	b = append(b, d.TransactionID[:]...)
	b = binary.BigEndian.AppendUint16(b, d.NumSeconds)
	b = binary.BigEndian.AppendUint16(b, d.Flags)
	for _, ip := range []net.IP{d.ClientIPAddr, d.YourIPAddr, d.ServerIPAddr, d.GatewayIPAddr} {
		var a [4]byte
		copy(a[:], ip.To4())
		b = append(b, a[:]...)
	}
	var chaddr [16]byte
	copy(chaddr[:], d.ClientHWAddr)
	b = append(b, chaddr[:]...)
	var sname [64]byte
	copy(sname[:63], d.ServerHostName)
	b = append(b, sname[:]...)
	var file [128]byte
	copy(file[:127], d.BootFileName)
	b = append(b, file[:]...)
	b = append(b, 99, 130, 83, 99) // the magic cookie
	var keys [256]uint8
	codes := keys[:0]
	agentInfo := false
	for c := range d.Options {
		switch c {
		case 0, 255: // pad and end are never written as options
		case 82:
			agentInfo = true // RFC 3046: last
		default:
			codes = append(codes, c)
		}
	}
	slices.Sort(codes)
	if agentInfo {
		codes = append(codes, 82)
	}
	for _, c := range codes {
		v := d.Options[c]
		if len(v) == 0 {
			b = append(b, c, 0)
			continue
		}
		for len(v) > 0 { // RFC 3396: over 255 bytes, the option repeats
			n := min(len(v), 255)
			b = append(b, c, byte(n))
			b = append(b, v[:n]...)
			v = v[n:]
		}
	}
	b = append(b, 255)
	for len(b)-start < 300 {
		b = append(b, 0)
	}
	return b
}

// packetBufs are the buffers replies are written into (a reply is at most
// a few hundred bytes; the pool keeps them across packets).
var packetBufs = sync.Pool{New: func() any { b := make([]byte, 0, 576); return &b }}
