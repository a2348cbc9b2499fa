package dhcp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

type catalog map[string]bool

func (c catalog) Has(n string) bool { return c[n] }

var fullCatalog = catalog{images.UndionlyKPXE: true, images.IPXEEFI: true, images.IPXEPXE: true}

var serverIP = netip.MustParseAddr("10.0.0.1")

func localRange() Range {
	return Range{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.199"),
		Router: []netip.Addr{netip.MustParseAddr("10.0.0.254")}, DNS: []netip.Addr{netip.MustParseAddr("10.0.0.53")}}
}

func relayRange() Range {
	return Range{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Start: netip.MustParseAddr("10.9.0.100"), End: netip.MustParseAddr("10.9.0.102"),
		Router: []netip.Addr{netip.MustParseAddr("10.9.0.1")}, Relayed: true}
}

type fixture struct {
	s   *Server
	st  store.Store
	inv *inventory.Inventory
	ctx context.Context
}

func newFixture(t testing.TB, mode Mode, mutate ...func(*Config)) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { inv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	c1, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	c2, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	t.Cleanup(func() { c1.Close(); c2.Close() })
	cfg := Config{Mode: mode, ServerIP: serverIP, Ranges: []Range{localRange(), relayRange()}, Catalog: fullCatalog,
		Store: st, Inventory: inv, Timeline: inv, Conn: c1, PXEConn: c2, LeaseTime: time.Hour}
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{s: s, st: st, inv: inv, ctx: ctx}
}

func mac(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x00, byte(i >> 16), byte(i >> 8), byte(i)}
}

// Client kinds as real clients send them.
func biosPXE(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))
}

func efiPXE(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003000"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.EFI_X86_64))
	d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, make([]byte, 16)...)))
}

func ipxeClient(d *dhcpv4.DHCPv4) {
	biosPXE(d)
	d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
	d.UpdateOption(dhcpv4.OptGeneric(optIPXEEncap, []byte{0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e}))
}

func httpClient(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016:UNDI:003001"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.Arch(16)))
}

func plain(d *dhcpv4.DHCPv4) {}

func discover(t testing.TB, hw net.HardwareAddr, kind func(*dhcpv4.DHCPv4), mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.NewDiscovery(hw, mods...)
	if err != nil {
		t.Fatal(err)
	}
	kind(d)
	return d
}

func (f *fixture) do(t testing.TB, m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	t.Helper()
	// Every packet goes through the wire format, as it would in reality.
	p, err := dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	return f.s.Respond(f.ctx, p, nil, dhcpv4.ServerPort)
}

func (f *fixture) dora(t testing.TB, hw net.HardwareAddr, kind func(*dhcpv4.DHCPv4)) (offer, ack *dhcpv4.DHCPv4) {
	t.Helper()
	offer, _ = f.do(t, discover(t, hw, kind))
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("no OFFER for %s: %v", hw, offer)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer)
	if err != nil {
		t.Fatal(err)
	}
	kind(req)
	ack, _ = f.do(t, req)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("no ACK for %s: %v", hw, ack)
	}
	return offer, ack
}

func (f *fixture) timeline(t testing.TB, hw net.HardwareAddr) string {
	t.Helper()
	if err := f.inv.FlushTimeline(f.ctx); err != nil {
		t.Fatal(err)
	}
	es, err := f.inv.Timeline(f.ctx, "", hw.String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%s %s %s | %v\n", e.GetSource(), e.GetEvent(), e.GetDetail(), e.GetAttributes())
	}
	return b.String()
}

func TestBootChoiceByClient(t *testing.T) {
	f := newFixture(t, ModeFull)
	for name, tc := range map[string]struct {
		kind     func(*dhcpv4.DHCPv4)
		file     string
		siaddr   string
		vendor   string // option 60 in the answer
		noVendor bool
	}{
		"BIOS firmware PXE": {kind: biosPXE, file: "undionly.kpxe", siaddr: "10.0.0.1", noVendor: true},
		"UEFI firmware PXE": {kind: efiPXE, file: "ipxe.efi", siaddr: "10.0.0.1", noVendor: true},
		"iPXE":              {kind: ipxeClient, file: "http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:00:00:0", vendor: "PXEClient"},
		"UEFI HTTP Boot":    {kind: httpClient, file: "http://10.0.0.1:8080/images/ipxe.efi?mac=52:54:00:00:00:0", vendor: "HTTPClient"},
		"plain client":      {kind: plain, file: "", noVendor: true},
	} {
		t.Run(name, func(t *testing.T) {
			hw := mac(len(name))
			offer, ack := f.dora(t, hw, tc.kind)
			for _, m := range []*dhcpv4.DHCPv4{offer, ack} {
				want := tc.file
				if strings.HasSuffix(want, "mac=52:54:00:00:00:0") {
					want = strings.TrimSuffix(want, "52:54:00:00:00:0") + hw.String()
				}
				if m.BootFileName != want {
					t.Errorf("%s file = %q, want %q", m.MessageType(), m.BootFileName, want)
				}
				if tc.siaddr != "" && m.ServerIPAddr.String() != tc.siaddr {
					t.Errorf("siaddr = %s", m.ServerIPAddr)
				}
				got := m.ClassIdentifier()
				if tc.noVendor && got != "" || !tc.noVendor && got != tc.vendor {
					t.Errorf("%s option 60 = %q, want %q", m.MessageType(), got, tc.vendor)
				}
				if m.Options.Has(dhcpv4.OptionVendorSpecificInformation) {
					t.Errorf("full mode sent option 43")
				}
				if !localRange().Contains(addrOf(m.YourIPAddr)) {
					t.Errorf("yiaddr %s outside the range", m.YourIPAddr)
				}
				if m.Router()[0].String() != "10.0.0.254" || m.DNS()[0].String() != "10.0.0.53" || m.IPAddressLeaseTime(0) != time.Hour {
					t.Errorf("options: router %v dns %v lease %v", m.Router(), m.DNS(), m.IPAddressLeaseTime(0))
				}
			}
		})
	}
}

func TestChooseBootArchitectures(t *testing.T) {
	env := Env{ScriptURL: func(m string) string { return "S" + m }, HTTPBase: "H", Has: catalog{images.UndionlyKPXE: true, images.IPXEEFI: true}.Has}
	for name, tc := range map[string]struct {
		c    Client
		kind BootKind
		file string
	}{
		"arch 0":             {Client{HasArch: true, Arch: 0, PXE: true}, BootTFTP, images.UndionlyKPXE},
		"arch 7":             {Client{HasArch: true, Arch: 7, PXE: true}, BootTFTP, images.IPXEEFI},
		"arch 9":             {Client{HasArch: true, Arch: 9, PXE: true}, BootTFTP, images.IPXEEFI},
		"arch 11 unshipped":  {Client{HasArch: true, Arch: 11, PXE: true}, BootNone, ""},
		"arch 16":            {Client{MAC: "m", HasArch: true, Arch: 16}, BootHTTP, "H/images/ipxe.efi?mac=m"},
		"arch 6 unsupported": {Client{HasArch: true, Arch: 6, PXE: true}, BootNone, ""},
		"PXEClient no 93":    {Client{PXE: true}, BootTFTP, images.UndionlyKPXE},
		"iPXE by 175":        {Client{MAC: "m", IPXE: true}, BootScript, "Sm"},
		"nothing":            {Client{}, BootNone, ""},
	} {
		b := ChooseBoot(tc.c, env)
		if b.Kind != tc.kind || b.File != tc.file || b.Reason == "" {
			t.Errorf("%s: got %+v, want %s %q", name, b, tc.kind, tc.file)
		}
	}
}

// TestChooseBootUEFIPrefersSNPOnly: with both in the catalog, UEFI
// firmware PXE gets snponly.efi (it starts seconds sooner than ipxe.efi).
func TestChooseBootUEFIPrefersSNPOnly(t *testing.T) {
	env := Env{HTTPBase: "H", Has: catalog{images.IPXEEFI: true, images.SNPOnlyEFI: true}.Has}
	for name, arch := range map[string]iana.Arch{"arch 7": 7, "arch 9": 9} {
		if b := ChooseBoot(Client{HasArch: true, Arch: arch, PXE: true}, env); b.Kind != BootTFTP || b.File != images.SNPOnlyEFI {
			t.Errorf("%s: got %+v, want TFTP %s", name, b, images.SNPOnlyEFI)
		}
	}
}

func TestLeasesStickyDurableAndExclusive(t *testing.T) {
	f := newFixture(t, ModeFull)
	a, b := mac(1), mac(2)
	_, ackA := f.dora(t, a, biosPXE)
	_, ackB := f.dora(t, b, plain)
	if ackA.YourIPAddr.Equal(ackB.YourIPAddr) {
		t.Fatal("two clients got one address")
	}
	// Stored.
	var l bootv1.Lease
	if _, err := record.Get(f.ctx, f.st, LeasePrefix+ackA.YourIPAddr.String(), &l); err != nil || l.GetMac() != a.String() || l.GetState() != bootv1.Lease_STATE_ACTIVE {
		t.Fatalf("stored lease: %v %v", &l, err)
	}
	// Release, then come back: same address (sticky).
	rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(a), dhcpv4.WithClientIP(ackA.YourIPAddr))
	if r, _ := f.do(t, rel); r != nil {
		t.Fatal("RELEASE answered")
	}
	record.Get(f.ctx, f.st, LeasePrefix+ackA.YourIPAddr.String(), &l)
	if l.GetState() != bootv1.Lease_STATE_RELEASED {
		t.Fatalf("after RELEASE: %v", &l)
	}
	_, again := f.dora(t, a, biosPXE)
	if !again.YourIPAddr.Equal(ackA.YourIPAddr) {
		t.Errorf("not sticky: %s then %s", ackA.YourIPAddr, again.YourIPAddr)
	}
	// A restarted server (same store) keeps the binding.
	f2 := &fixture{s: mustNew(t, f), st: f.st, inv: f.inv, ctx: f.ctx}
	offer, _ := f2.do(t, discover(t, a, biosPXE))
	if !offer.YourIPAddr.Equal(ackA.YourIPAddr) {
		t.Errorf("after restart: offered %s, want %s", offer.YourIPAddr, ackA.YourIPAddr)
	}
	// Renewal (ciaddr) answers unicast to the client.
	ren, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(a), dhcpv4.WithClientIP(ackA.YourIPAddr))
	r, dst := f.do(t, ren)
	if r == nil || r.MessageType() != dhcpv4.MessageTypeAck || dst.String() != ackA.YourIPAddr.String()+":68" {
		t.Fatalf("renew: %v to %v", r, dst)
	}
	// B asking for A's address is refused.
	steal, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(b),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ackA.YourIPAddr)))
	r, _ = f.do(t, steal)
	if r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("stealing: %v", r)
	}
	// Foreign address: NAK.
	foreign, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(b),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(192, 168, 1, 5))))
	r, dst = f.do(t, foreign)
	if r == nil || r.MessageType() != dhcpv4.MessageTypeNak || !dst.IP.Equal(net.IPv4bcast) {
		t.Fatalf("foreign: %v to %v", r, dst)
	}
	// REQUEST for another server: silence.
	other, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(b),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2))), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ackB.YourIPAddr)))
	if r, _ := f.do(t, other); r != nil {
		t.Fatalf("answered a REQUEST for another server: %v", r)
	}
	tl := f.timeline(t, a)
	for _, want := range []string{"dhcp discover DISCOVER: arch 0", "dhcp offer OFFER 10.0.0.", "boot tftp undionly.kpxe", "dhcp ack ACK", "dhcp release RELEASE"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %q:\n%s", want, tl)
		}
	}
	if m, err := f.inv.MachineByMAC(f.ctx, a.String()); err != nil || m.GetState() != inventoryv1.Machine_DISCOVERED {
		t.Errorf("PXE client's machine: %v %v", m, err)
	}
	if _, err := f.inv.MachineByMAC(f.ctx, b.String()); err == nil {
		t.Errorf("a plain DHCP client became a machine")
	}
}

func mustNew(t *testing.T, f *fixture) *Server {
	t.Helper()
	cfg := f.s.cfg
	s, err := New(f.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecline(t *testing.T) {
	f := newFixture(t, ModeFull)
	a := mac(7)
	_, ack := f.dora(t, a, biosPXE)
	dec, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithHwAddr(a),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ack.YourIPAddr)))
	if r, _ := f.do(t, dec); r != nil {
		t.Fatal("DECLINE answered")
	}
	offer, _ := f.do(t, discover(t, a, biosPXE))
	if offer.YourIPAddr.Equal(ack.YourIPAddr) {
		t.Errorf("declined address offered again")
	}
	var l bootv1.Lease
	record.Get(f.ctx, f.st, LeasePrefix+ack.YourIPAddr.String(), &l)
	if l.GetState() != bootv1.Lease_STATE_DECLINED || l.GetMac() != "" {
		t.Errorf("declined lease: %v", &l)
	}
	if !strings.Contains(f.timeline(t, a), "dhcp decline DECLINE") {
		t.Error("decline not on the timeline")
	}
}

func TestRelay(t *testing.T) {
	f := newFixture(t, ModeFull)
	giaddr := net.IPv4(10, 9, 0, 1)
	d := discover(t, mac(9), biosPXE, dhcpv4.WithGatewayIP(giaddr))
	offer, dst := f.do(t, d)
	if offer == nil || !relayRange().Contains(addrOf(offer.YourIPAddr)) {
		t.Fatalf("relayed offer: %v", offer)
	}
	if dst.String() != "10.9.0.1:67" || !offer.GatewayIPAddr.Equal(giaddr) || offer.Router()[0].String() != "10.9.0.1" {
		t.Fatalf("relayed offer to %v giaddr %v router %v", dst, offer.GatewayIPAddr, offer.Router())
	}
	if ones, _ := offer.SubnetMask().Size(); ones != 24 {
		t.Errorf("mask /%d", ones)
	}
	// Lease the whole 3-address relay range; the 4th client gets nothing.
	for i := 8; i < 11; i++ {
		o, _ := f.do(t, discover(t, mac(i), plain, dhcpv4.WithGatewayIP(giaddr)))
		if o == nil {
			t.Fatalf("client %d: no offer", i)
		}
		req, _ := dhcpv4.NewRequestFromOffer(o)
		req.GatewayIPAddr = giaddr
		if a, _ := f.do(t, req); a == nil || a.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("client %d: no ACK: %v", i, a)
		}
	}
	if o, _ := f.do(t, discover(t, mac(12), plain, dhcpv4.WithGatewayIP(giaddr))); o != nil {
		t.Fatalf("offer from an exhausted range: %s", o.YourIPAddr)
	}
	// Unknown relay: ignored, with the reason on the timeline.
	if o, _ := f.do(t, discover(t, mac(13), biosPXE, dhcpv4.WithGatewayIP(net.IPv4(172, 16, 0, 1)))); o != nil {
		t.Fatal("answered an unknown relay")
	}
	if !strings.Contains(f.timeline(t, mac(13)), "no range for relay 172.16.0.1") {
		t.Error("unknown relay not explained on the timeline")
	}
}

func TestProxy(t *testing.T) {
	f := newFixture(t, ModeProxy, func(c *Config) { c.Ranges = nil; c.Store = nil })
	for name, tc := range map[string]struct {
		kind func(*dhcpv4.DHCPv4)
		file string
		opt  bool
	}{
		"BIOS": {biosPXE, images.UndionlyKPXE, true},
		"UEFI": {efiPXE, images.IPXEEFI, true},
		"iPXE": {ipxeClient, "http://10.0.0.1:8080/boot.ipxe?mac=", true},
	} {
		t.Run(name, func(t *testing.T) {
			hw := mac(100 + len(name))
			offer, dst := f.do(t, discover(t, hw, tc.kind))
			if offer == nil {
				t.Fatal("no proxy offer")
			}
			if !offer.YourIPAddr.IsUnspecified() || offer.ClassIdentifier() != "PXEClient" || !strings.HasPrefix(offer.BootFileName, tc.file) {
				t.Fatalf("proxy offer yiaddr %s 60 %q file %q", offer.YourIPAddr, offer.ClassIdentifier(), offer.BootFileName)
			}
			if string(offer.Options.Get(dhcpv4.OptionVendorSpecificInformation)) != "\x06\x01\x08\xff" {
				t.Errorf("option 43 = %x", offer.Options.Get(dhcpv4.OptionVendorSpecificInformation))
			}
			if offer.Options.Has(dhcpv4.OptionIPAddressLeaseTime) || offer.Options.Has(dhcpv4.OptionRouter) {
				t.Error("proxy offer carries lease options")
			}
			if !dst.IP.Equal(net.IPv4bcast) {
				t.Errorf("dst %v", dst)
			}
			// Port 4011 boot-server request from the leased address.
			req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(hw), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 77)))
			tc.kind(req)
			p, _ := dhcpv4.FromBytes(req.ToBytes())
			ack, dst := f.s.Respond(f.ctx, p, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 77), Port: 68}, PXEPort)
			if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || !strings.HasPrefix(ack.BootFileName, tc.file) || dst.String() != "10.0.0.77:68" {
				t.Fatalf("4011: %v to %v", ack, dst)
			}
			if mac, _ := f.s.MACForIP(net.IPv4(10, 0, 0, 77)); mac != hw.String() {
				t.Errorf("MACForIP = %q", mac)
			}
		})
	}
	// Plain clients and REQUESTs are the other server's business.
	if o, _ := f.do(t, discover(t, mac(200), plain)); o != nil {
		t.Error("proxy answered a plain client")
	}
	req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac(201)), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 5))))
	biosPXE(req)
	if o, _ := f.do(t, req); o != nil {
		t.Error("proxy answered a REQUEST")
	}
}

func TestGarbageAndBadInput(t *testing.T) {
	f := newFixture(t, ModeFull)
	for name, m := range map[string]func() *dhcpv4.DHCPv4{
		"reply opcode": func() *dhcpv4.DHCPv4 {
			d := discover(t, mac(1), biosPXE)
			d.OpCode = dhcpv4.OpcodeBootReply
			return d
		},
		"no message type": func() *dhcpv4.DHCPv4 {
			d := discover(t, mac(1), biosPXE)
			d.Options.Del(dhcpv4.OptionDHCPMessageType)
			return d
		},
		"short hwaddr": func() *dhcpv4.DHCPv4 {
			d := discover(t, mac(1), biosPXE)
			d.ClientHWAddr = d.ClientHWAddr[:3]
			return d
		},
		"zero mac": func() *dhcpv4.DHCPv4 { return discover(t, make(net.HardwareAddr, 6), biosPXE) },
		"weird arch and option values": func() *dhcpv4.DHCPv4 {
			d := discover(t, mac(2), plain)
			d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0xff}))
			d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionUserClassInformation, []byte{200}))
			d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, make([]byte, 200)))
			return d
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, _ := f.s.Respond(f.ctx, m(), nil, dhcpv4.ServerPort)
			if name != "weird arch and option values" && r != nil {
				t.Fatalf("answered: %v", r)
			}
		})
	}
	// Truncated packets never parse into something answered.
	raw := discover(t, mac(3), biosPXE).ToBytes()
	for n := 0; n < len(raw); n += 7 {
		if p, err := dhcpv4.FromBytes(raw[:n]); err == nil {
			f.s.Respond(f.ctx, p, nil, dhcpv4.ServerPort)
		}
	}
	// Still serving.
	f.dora(t, mac(4), biosPXE)
}

func TestConcurrentDORAUniqueAndDurable(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Ranges = []Range{{Subnet: netip.MustParsePrefix("10.0.0.0/16"), Start: netip.MustParseAddr("10.0.1.0"), End: netip.MustParseAddr("10.0.4.255")}}
	})
	const n = 300
	var wg sync.WaitGroup
	acks := make([]net.IP, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ack := f.dora(t, mac(1000+i), biosPXE)
			acks[i] = ack.YourIPAddr
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, ip := range acks {
		if seen[ip.String()] {
			t.Fatalf("client %d: %s handed out twice", i, ip)
		}
		seen[ip.String()] = true
	}
	kvs, _ := f.st.List(f.ctx, LeasePrefix)
	if len(kvs) != n {
		t.Fatalf("%d leases stored, want %d", len(kvs), n)
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"full", "proxy", "off"} {
		if _, err := ParseMode(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseMode("auto"); err == nil {
		t.Error("auto accepted")
	}
}

func TestFloodDoesNotLockOut(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Ranges = []Range{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.104")}}
	})
	for i := range 50 {
		f.do(t, discover(t, mac(5000+i), plain))
	}
	f.dora(t, mac(1), biosPXE)
}
