package ra

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

func TestAdvertisementLifetimeZero(t *testing.T) {
	hw := net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}
	b := Advertisement(hw)
	m, err := icmp.ParseMessage(58, b)
	if err != nil || m.Type != ipv6.ICMPTypeRouterAdvertisement {
		t.Fatalf("%v %v", m, err)
	}
	body := m.Body.(*icmp.RawBody).Data
	if lifetime := binary.BigEndian.Uint16(body[2:4]); lifetime != 0 {
		t.Errorf("router lifetime %d, want 0", lifetime)
	}
	if body[1] != 0 {
		t.Errorf("flags %08b, want none (no DHCPv6)", body[1])
	}
	if len(body) != 20 || body[12] != 1 || body[13] != 1 || net.HardwareAddr(body[14:20]).String() != hw.String() {
		t.Errorf("source link-layer option: % x", body[12:])
	}
}

func TestParseRS(t *testing.T) {
	rs := func(opts []byte) []byte {
		b, _ := (&icmp.Message{Type: ipv6.ICMPTypeRouterSolicitation, Body: &icmp.RawBody{Data: append(make([]byte, 4), opts...)}}).Marshal(nil)
		return b
	}
	for name, tc := range map[string]struct {
		b    []byte
		mac  string
		isRS bool
	}{
		"with SLLAO":  {rs([]byte{1, 1, 0x52, 0x54, 0, 0xaa, 0, 1}), "52:54:00:aa:00:01", true},
		"without":     {rs(nil), "", true},
		"zero length": {rs([]byte{1, 0, 0, 0, 0, 0, 0, 0}), "", true},
		"bad length":  {rs([]byte{1, 9, 0, 0, 0, 0, 0, 0}), "", true},
		"not an RS":   {Advertisement(nil), "", false},
		"garbage":     {[]byte{133}, "", false},
		"empty":       {nil, "", false},
	} {
		mac, ok := ParseRS(tc.b)
		if mac != tc.mac || ok != tc.isRS {
			t.Errorf("%s: ParseRS = %q, %v; want %q, %v", name, mac, ok, tc.mac, tc.isRS)
		}
	}
}

func TestAdvertisementManaged(t *testing.T) {
	p := Params{Managed: true, Other: true, RouterLifetime: 1800 * time.Second, OnLink: []netip.Prefix{netip.MustParsePrefix("fd00:c0::/64")}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := icmp.ParseMessage(58, AdvertisementWith(net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}, p))
	if err != nil {
		t.Fatal(err)
	}
	body := m.Body.(*icmp.RawBody).Data
	if body[1] != 0xc0 || binary.BigEndian.Uint16(body[2:4]) != 1800 {
		t.Fatalf("flags %08b lifetime %d", body[1], binary.BigEndian.Uint16(body[2:4]))
	}
	pio := body[20:]
	if len(pio) != 32 || pio[0] != 3 || pio[1] != 4 || pio[2] != 64 || pio[3] != 0x80 || netip.AddrFrom16([16]byte(pio[16:32])) != netip.MustParseAddr("fd00:c0::") {
		t.Fatalf("prefix information % x", pio)
	}
	for _, bad := range []Params{{RouterLifetime: 9001 * time.Second}, {RouterLifetime: -1}, {OnLink: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
