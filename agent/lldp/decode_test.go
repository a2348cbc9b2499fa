package lldp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tlv is one LLDP TLV: 7 bits of type, 9 bits of length, the value. A
// length below zero writes the value's own length.
func tlv(typ byte, value []byte, length int) []byte {
	if length < 0 {
		length = len(value)
	}
	h := uint16(typ)<<9 | uint16(length)&0x1ff
	return append(binary.BigEndian.AppendUint16(nil, h), value...)
}

// frame is an Ethernet frame to the LLDP group address carrying tlvs.
func frame(tlvs ...[]byte) []byte {
	b := append([]byte{}, Multicast...)
	b = append(b, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xcc)
	for _, t := range tlvs {
		b = append(b, t...)
	}
	return b
}

var (
	chassisMAC = tlv(1, []byte{4, 0x52, 0x54, 0, 0x12, 0x34, 0x56}, -1)
	portName   = tlv(2, append([]byte{5}, "Ethernet1/12"...), -1)
	ttl        = tlv(3, []byte{0, 120}, -1)
	end        = tlv(0, nil, -1)
)

func org8021(subtype byte, info ...byte) []byte {
	return tlv(127, append([]byte{0x00, 0x80, 0xc2, subtype}, info...), -1)
}

func TestDecode(t *testing.T) {
	mgmt := tlv(8, []byte{5, 1, 10, 0, 0, 2, 2, 0, 0, 0, 7, 0}, -1)
	tests := map[string]struct {
		frame []byte
		want  Neighbor
		err   bool
	}{
		"switch": {
			frame: frame(chassisMAC, portName, ttl,
				tlv(4, []byte("rack 4 uplink"), -1),
				tlv(5, []byte("leaf-04"), -1),
				mgmt,
				org8021(1, 0, 42),
				org8021(3, 0, 42, 7, 's', 't', 'o', 'r', 'a', 'g', 'e'),
				end),
			want: Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", PortDescription: "rack 4 uplink",
				SystemName: "leaf-04", ManagementAddress: "10.0.0.2", VLAN: 42, VLANNames: []string{"42 storage"}},
		},
		"mandatory TLVs only": {
			frame: frame(chassisMAC, portName, ttl, end),
			want:  Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12"},
		},
		"network address chassis, MAC port": {
			frame: frame(tlv(1, []byte{5, 1, 192, 0, 2, 9}, -1), tlv(2, []byte{3, 2, 0, 0, 0, 0, 1}, -1), ttl, end),
			want:  Neighbor{ChassisID: "192.0.2.9", PortID: "02:00:00:00:00:01"},
		},
		"escape sequences escaped": {
			frame: frame(chassisMAC, portName, ttl, tlv(5, []byte("sw\x1b]52;c;aGk=\x07"), -1), end),
			want:  Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", SystemName: `sw\x1b]52;c;aGk=\x07`},
		},
		"invalid UTF-8 replaced": {
			frame: frame(chassisMAC, portName, ttl, tlv(4, []byte{'a', 0xff, 'b'}, -1), end),
			want:  Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", PortDescription: "a\uFFFDb"},
		},
		"oversized string capped": {
			frame: frame(chassisMAC, portName, ttl, tlv(5, bytes.Repeat([]byte("x"), 511), -1), end),
			want:  Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", SystemName: strings.Repeat("x", MaxString)},
		},
		"malformed 802.1 TLV dropped": {
			frame: frame(chassisMAC, portName, ttl, tlv(5, []byte("leaf"), -1), org8021(1, 42), end),
			want:  Neighbor{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", SystemName: "leaf"},
		},
		"truncated TLV":           {frame: frame(chassisMAC, portName, tlv(3, []byte{0}, 2)), err: true},
		"length past the end":     {frame: frame(chassisMAC, tlv(2, []byte{5, 'a'}, 300)), err: true},
		"zero-length chassis ID":  {frame: frame(tlv(1, nil, -1), portName, ttl, end), err: true},
		"zero-length port ID":     {frame: frame(chassisMAC, tlv(2, nil, -1), ttl, end), err: true},
		"one byte":                {frame: frame([]byte{0x02}), err: true},
		"empty LLDPDU":            {frame: frame(), err: true},
		"not LLDP":                {frame: append(append([]byte{}, Multicast...), 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45), err: true},
		"runt":                    {frame: []byte{1, 2, 3}, err: true},
		"chassis ID subtype only": {frame: frame(tlv(1, []byte{4}, -1), portName, ttl, end), err: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Decode(tc.frame)
			if (err != nil) != tc.err {
				t.Fatalf("Decode: err %v, want error %v (got %+v)", err, tc.err, got)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeVLANNamesBounded(t *testing.T) {
	tlvs := [][]byte{chassisMAC, portName, ttl}
	for i := range 40 {
		tlvs = append(tlvs, org8021(3, 0, byte(i+1), 1, 'v'))
	}
	got, err := Decode(frame(append(tlvs, end)...))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.VLANNames) != MaxVLANNames {
		t.Errorf("%d VLAN names, want %d", len(got.VLANNames), MaxVLANNames)
	}
}

func TestDecodeNotLLDP(t *testing.T) {
	_, err := Decode(append(append([]byte{}, Multicast...), 0x02, 0, 0, 0, 0, 1, 0x08, 0x00))
	if !errors.Is(err, ErrNotLLDP) {
		t.Errorf("err %v, want ErrNotLLDP", err)
	}
}

// FuzzDecode: whatever a frame holds, Decode does not panic, and what it
// returns is bounded and printable.
func FuzzDecode(f *testing.F) {
	f.Add(frame(chassisMAC, portName, ttl, tlv(5, []byte("leaf"), -1), org8021(1, 0, 42), org8021(3, 0, 42, 1, 'v'), end))
	f.Add(frame(chassisMAC, portName, tlv(3, []byte{0}, 2)))
	f.Add(frame(tlv(1, nil, -1), portName, ttl, end))
	f.Add(frame(chassisMAC, portName, ttl, org8021(3, 0, 1, 200, 'v'), end))
	f.Add(frame(chassisMAC, portName, ttl, tlv(8, []byte{5, 1, 10, 0, 0, 2, 2, 0, 0, 0, 7, 9}, -1), end))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := Decode(b)
		if err != nil {
			return
		}
		if n.ChassisID == "" || n.PortID == "" {
			t.Fatalf("neighbour without an ID: %+v", n)
		}
		if len(n.VLANNames) > MaxVLANNames {
			t.Fatalf("%d VLAN names", len(n.VLANNames))
		}
		for _, s := range append([]string{n.ChassisID, n.PortID, n.PortDescription, n.SystemName, n.ManagementAddress}, n.VLANNames...) {
			if len(s) > MaxString {
				t.Fatalf("string of %d bytes", len(s))
			}
			for _, r := range s {
				if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
					t.Fatalf("control character in %q", s)
				}
			}
		}
	})
}
