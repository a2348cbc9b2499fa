package dhcp

import (
	"bytes"
	"encoding/binary"
	"net"
	"slices"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
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

// parsePacket decodes a DHCPv4 packet: the same *dhcpv4.DHCPv4 as
// dhcpv4.FromBytes (fuzzed against it), from one copy of q where FromBytes
// makes a buffer, a copy per address, per option and for the MAC. The
// result does not share memory with q (serve reuses its read buffer).
// A packet it cannot take apart the easy way (shorter than the fixed
// header, a bad magic cookie, an option running past the end, no End
// option) goes to dhcpv4.FromBytes, for the library's error.
func parsePacket(q []byte) (*dhcpv4.DHCPv4, error) {
	const fixed = 236 + 4 // the fixed fields, then the magic cookie
	if len(q) < fixed || [4]byte(q[236:240]) != [4]byte{99, 130, 83, 99} {
		return dhcpv4.FromBytes(q)
	}
	// First the options' extent (up to End), checked, without copying.
	in := q[fixed:]
	end := 0
	for {
		if end >= len(in) {
			return dhcpv4.FromBytes(q) // no End option
		}
		switch in[end] {
		case 0: // pad
			end++
			continue
		case 255:
		default:
			if end+1 >= len(in) || end+2+int(in[end+1]) > len(in) {
				return dhcpv4.FromBytes(q) // runs past the end
			}
			end += 2 + int(in[end+1])
			continue
		}
		break
	}
	// One block: the four addresses and chaddr (16 bytes, as FromBytes
	// reads them), then the options up to End.
	blk := make([]byte, 32+end)
	copy(blk[0:16], q[12:28])
	copy(blk[16:32], q[28:44])
	opts := blk[32:]
	copy(opts, in[:end])
	p := &dhcpv4.DHCPv4{
		OpCode:        dhcpv4.OpcodeType(q[0]),
		HWType:        iana.HWType(q[1]),
		HopCount:      q[3],
		TransactionID: dhcpv4.TransactionID(q[4:8]),
		NumSeconds:    binary.BigEndian.Uint16(q[8:10]),
		Flags:         binary.BigEndian.Uint16(q[10:12]),
		ClientIPAddr:  net.IP(blk[0:4:4]),
		YourIPAddr:    net.IP(blk[4:8:8]),
		ServerIPAddr:  net.IP(blk[8:12:12]),
		GatewayIPAddr: net.IP(blk[12:16:16]),
		ClientHWAddr:  net.HardwareAddr(blk[16:32][:min(q[2], 16)]),
	}
	p.ServerHostName = cstring(q[44:108])
	p.BootFileName = cstring(q[108:236])
	o := make(dhcpv4.Options)
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == 0 { // pad
			i++
			continue
		}
		n := int(opts[i+1])
		v := opts[i+2 : i+2+n : i+2+n]
		i += 2 + n
		prev, seen := o[code]
		switch {
		case seen:
			// RFC 3396: instances of an option are concatenated (into
			// memory of their own: v's neighbours are other options).
			o[code] = append(prev[:len(prev):len(prev)], v...)
		case n == 0:
			o[code] = nil // as FromBytes's append(nil) leaves it
		default:
			o[code] = v
		}
	}
	p.Options = o
	return p, nil
}

// cstring is a NUL-terminated field as FromBytes reads it: up to the
// first NUL, or all of it.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
