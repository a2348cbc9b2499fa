package dhcp6

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

type catalog map[string]bool

func (c catalog) Has(n string) bool { return c[n] }

var fullCatalog = catalog{images.SNPOnlyEFI: true, images.IPXEEFI: true}

var serverIP = netip.MustParseAddr("fd00:c0::1")

func localRange() Range {
	return Range{Prefix: netip.MustParsePrefix("fd00:c0::/64"), Start: netip.MustParseAddr("fd00:c0::100"), End: netip.MustParseAddr("fd00:c0::1ff"),
		DNS: []netip.Addr{netip.MustParseAddr("fd00:c0::53")}}
}

func relayRange() Range {
	return Range{Prefix: netip.MustParsePrefix("fd00:99::/64"), Start: netip.MustParseAddr("fd00:99::100"), End: netip.MustParseAddr("fd00:99::102"), Relayed: true}
}

type fixture struct {
	s   *Server
	st  store.Store
	inv *inventory.Inventory
	ctx context.Context
}

func newFixture(t testing.TB, mutate ...func(*Config)) *fixture {
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
	fx := &fixture{st: st, inv: inv, ctx: ctx}
	fx.s = fx.server(t, mutate...)
	return fx
}

// server makes another Server on fx's store (a restart).
func (fx *fixture) server(t testing.TB, mutate ...func(*Config)) *Server {
	t.Helper()
	c, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cfg := Config{ServerIP: serverIP, Ranges: []Range{localRange(), relayRange()}, Catalog: fullCatalog, Store: fx.st, Inventory: fx.inv,
		Timeline: fx.inv, Conn: c, LeaseTime: time.Hour, HTTPBase: "http://[fd00:c0::1]:8080",
		DUID: &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(fx.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mac(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x00, byte(i >> 16), byte(i >> 8), byte(i)}
}

var clientPeer = netip.MustParseAddrPort("[fe80::5054:ff:fe00:1]:546")

// Client kinds as real clients send them (OVMF PXEv6: DUID-UUID, arch 7,
// vendor class PXEClient; iPXE: DUID-LL and user class iPXE).
func pxe6(m *dhcpv6.Message) {
	m.UpdateOption(dhcpv6.OptClientArchType(iana.EFI_X86_64))
	m.UpdateOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: [][]byte{[]byte("PXEClient:Arch:00007:UNDI:003000")}})
	m.UpdateOption(dhcpv6.OptRequestedOption(dhcpv6.OptionBootfileURL, dhcpv6.OptionBootfileParam))
}

func http6(m *dhcpv6.Message) {
	m.UpdateOption(dhcpv6.OptClientArchType(iana.Arch(16)))
	m.UpdateOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: [][]byte{[]byte("HTTPClient:Arch:00016:UNDI:003001")}})
}

func ipxe6(m *dhcpv6.Message) {
	m.UpdateOption(&dhcpv6.OptUserClass{UserClasses: [][]byte{[]byte("iPXE")}})
	m.UpdateOption(dhcpv6.OptRequestedOption(dhcpv6.OptionBootfileURL))
}

func plain6(*dhcpv6.Message) {}

func duid(hw net.HardwareAddr) dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: hw}
}

func msg(t testing.TB, typ dhcpv6.MessageType, id dhcpv6.DUID, kind func(*dhcpv6.Message), opts ...dhcpv6.Option) *dhcpv6.Message {
	t.Helper()
	m := &dhcpv6.Message{MessageType: typ, TransactionID: dhcpv6.TransactionID{1, 2, 3}}
	if id != nil {
		m.AddOption(dhcpv6.OptClientID(id))
	}
	for _, o := range opts {
		m.AddOption(o)
	}
	kind(m)
	return m
}

func ia(iaid byte, addrs ...netip.Addr) *dhcpv6.OptIANA {
	o := &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, iaid}}
	for _, a := range addrs {
		o.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: a.AsSlice()})
	}
	return o
}

func (fx *fixture) ask(t testing.TB, s *Server, m dhcpv6.DHCPv6, peer netip.AddrPort) dhcpv6.DHCPv6 {
	t.Helper()
	out, dst, ok := s.Respond(fx.ctx, m.ToBytes(), peer)
	if !ok {
		return nil
	}
	if dst != peer {
		t.Fatalf("reply to %s, want %s", dst, peer)
	}
	d, err := dhcpv6.FromBytes(out)
	if err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	return d
}

func (fx *fixture) askMsg(t testing.TB, s *Server, m *dhcpv6.Message) *dhcpv6.Message {
	t.Helper()
	d := fx.ask(t, s, m, clientPeer)
	if d == nil {
		return nil
	}
	return d.(*dhcpv6.Message)
}

func addrOf(t testing.TB, m *dhcpv6.Message) netip.Addr {
	t.Helper()
	i := m.Options.OneIANA()
	if i == nil || i.Options.OneAddress() == nil {
		t.Fatalf("no IA_NA address in %s", m.Summary())
	}
	a, _ := netip.AddrFromSlice(i.Options.OneAddress().IPv6Addr)
	return a
}

func iaStatus(m *dhcpv6.Message) iana.StatusCode {
	if i := m.Options.OneIANA(); i != nil {
		if st := i.Options.Status(); st != nil {
			return st.StatusCode
		}
	}
	return iana.StatusSuccess
}

// lease runs SOLICIT → ADVERTISE → REQUEST → REPLY and returns the
// bound address.
func (fx *fixture) lease(t testing.TB, s *Server, id dhcpv6.DUID, kind func(*dhcpv6.Message)) (netip.Addr, *dhcpv6.Message) {
	t.Helper()
	adv := fx.askMsg(t, s, msg(t, dhcpv6.MessageTypeSolicit, id, kind, ia(1)))
	if adv == nil || adv.MessageType != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("SOLICIT answered %v", adv)
	}
	offered := addrOf(t, adv)
	rep := fx.askMsg(t, s, msg(t, dhcpv6.MessageTypeRequest, id, kind, ia(1, offered), dhcpv6.OptServerID(s.duid)))
	if rep == nil || rep.MessageType != dhcpv6.MessageTypeReply {
		t.Fatalf("REQUEST answered %v", rep)
	}
	if got := addrOf(t, rep); got != offered {
		t.Fatalf("bound %s, offered %s", got, offered)
	}
	return offered, rep
}

func TestExchangeIsDurableAndSticky(t *testing.T) {
	fx := newFixture(t)
	id := duid(mac(1))
	ip, rep := fx.lease(t, fx.s, id, pxe6)
	if !localRange().Contains(ip) {
		t.Fatalf("address %s outside the range", ip)
	}
	if got, want := rep.Options.BootFileURL(), "tftp://[fd00:c0::1]/snponly.efi"; got != want {
		t.Fatalf("boot file URL %q, want %q", got, want)
	}
	var l bootv1.Lease
	if _, err := record.Get(fx.ctx, fx.st, LeasePrefix+ip.String(), &l); err != nil {
		t.Fatal(err)
	}
	if l.GetMac() != mac(1).String() || l.GetIaid() != 1 || l.GetDuid() == "" || l.GetState() != bootv1.Lease_STATE_ACTIVE {
		t.Fatalf("stored lease %v", &l)
	}
	if h, ok, _ := fx.s.LeaseHolder(fx.ctx, ip); !ok || h != mac(1).String() {
		t.Fatalf("LeaseHolder(%s) = %q %v", ip, h, ok)
	}
	// A restarted server keeps the binding: the same client is offered
	// its address, another client a different one.
	s2 := fx.server(t)
	again, _ := fx.lease(t, s2, id, pxe6)
	other, _ := fx.lease(t, s2, duid(mac(2)), pxe6)
	if again != ip || other == ip {
		t.Fatalf("after restart: client got %s (had %s), another got %s", again, ip, other)
	}
	if _, err := fx.inv.MachineByMAC(fx.ctx, mac(1).String()); err != nil {
		t.Fatalf("the PXE client is no machine: %v", err)
	}
}

func TestRapidCommit(t *testing.T) {
	fx := newFixture(t)
	rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(3)), ipxe6, ia(1), &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit}))
	if rep == nil || rep.MessageType != dhcpv6.MessageTypeReply || rep.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
		t.Fatalf("rapid-commit SOLICIT answered %v", rep)
	}
	ip := addrOf(t, rep)
	if h, ok, _ := fx.s.LeaseHolder(fx.ctx, ip); !ok || h != mac(3).String() {
		t.Fatal("rapid commit did not bind")
	}
	if got, want := rep.Options.BootFileURL(), "http://[fd00:c0::1]:8080/boot.ipxe?mac="+mac(3).String(); got != want {
		t.Fatalf("iPXE boot URL %q, want %q", got, want)
	}
	// Off: an ADVERTISE, nothing bound.
	fx2 := newFixture(t, func(c *Config) { c.NoRapidCommit = true })
	adv := fx2.askMsg(t, fx2.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(3)), ipxe6, ia(1), &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit}))
	if adv.MessageType != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("rapid commit off: %s", adv.MessageType)
	}
}

func TestBootChoice(t *testing.T) {
	for name, tc := range map[string]struct {
		kind      func(*dhcpv6.Message)
		url       string
		httpEchoe bool
	}{
		"OVMF PXEv6":   {pxe6, "tftp://[fd00:c0::1]/snponly.efi", false},
		"OVMF HTTPv6":  {http6, "http://[fd00:c0::1]:8080/images/ipxe.efi", true},
		"iPXE":         {ipxe6, "http://[fd00:c0::1]:8080/boot.ipxe?mac=52:54:00:00:00:07", false},
		"plain client": {plain6, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t)
			_, rep := fx.lease(t, fx.s, duid(mac(7)), tc.kind)
			if got := rep.Options.BootFileURL(); got != tc.url {
				t.Fatalf("boot URL %q, want %q", got, tc.url)
			}
			echoed := len(rep.Options.VendorClass(enterpriseEDK2)) > 0
			if echoed != tc.httpEchoe {
				t.Fatalf("HTTPClient echoed %v", echoed)
			}
		})
	}
}

// A client without a MAC in its DUID is matched by the EUI-64 of its
// link-local source (OVMF sends DUID-UUID).
func TestMACFromLinkLocal(t *testing.T) {
	fx := newFixture(t)
	uuid := &dhcpv6.DUIDUUID{UUID: [16]byte{1, 2, 3}}
	_, rep := fx.lease(t, fx.s, uuid, pxe6)
	if rep.Options.BootFileURL() == "" {
		t.Fatal("no boot file for a DUID-UUID client")
	}
	if _, err := fx.inv.MachineByMAC(fx.ctx, "52:54:00:00:00:01"); err != nil {
		t.Fatalf("no machine for the link-local EUI-64's MAC: %v", err)
	}
}

// Spoofing: another DUID cannot renew, release or decline a client's
// address, and a REQUEST naming another server is not answered.
func TestSpoofRefused(t *testing.T) {
	fx := newFixture(t)
	ip, _ := fx.lease(t, fx.s, duid(mac(1)), pxe6)
	sid := dhcpv6.OptServerID(fx.s.duid)
	thief := duid(mac(66))
	for _, typ := range []dhcpv6.MessageType{dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline} {
		rep := fx.askMsg(t, fx.s, msg(t, typ, thief, plain6, ia(1, ip), sid))
		if rep == nil || iaStatus(rep) != iana.StatusNoBinding {
			t.Fatalf("%s of another client's address answered %v", typ, rep)
		}
	}
	rebind := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeRebind, thief, plain6, ia(1, ip)))
	if rebind == nil || iaStatus(rebind) != iana.StatusNoBinding {
		t.Fatalf("REBIND of another client's address answered %v", rebind)
	}
	if h, ok, _ := fx.s.LeaseHolder(fx.ctx, ip); !ok || h != mac(1).String() {
		t.Fatalf("the lease moved: %q %v", h, ok)
	}
	other := &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: net.HardwareAddr{2, 9, 9, 9, 9, 9}}
	if rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeRequest, duid(mac(1)), plain6, ia(1, ip), dhcpv6.OptServerID(other))); rep != nil {
		t.Fatal("answered a REQUEST for another server")
	}
	if rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(1)), plain6, ia(1), sid)); rep != nil {
		t.Fatal("answered a SOLICIT naming a server")
	}
	// The holder itself renews, then releases; then DECLINE quarantines.
	if rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeRenew, duid(mac(1)), plain6, ia(1, ip), sid)); iaStatus(rep) != iana.StatusSuccess || addrOf(t, rep) != ip {
		t.Fatalf("RENEW by the holder: %v", rep)
	}
	if rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeRelease, duid(mac(1)), plain6, ia(1, ip), sid)); rep == nil || iaStatus(rep) != iana.StatusSuccess {
		t.Fatalf("RELEASE by the holder: %v", rep)
	}
	if _, ok, _ := fx.s.LeaseHolder(fx.ctx, ip); ok {
		t.Fatal("released lease still held")
	}
	ip2, _ := fx.lease(t, fx.s, duid(mac(1)), pxe6)
	if ip2 != ip {
		t.Fatalf("released client came back to %s, had %s", ip2, ip)
	}
	if rep := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeDecline, duid(mac(1)), plain6, ia(1, ip), sid)); rep == nil || iaStatus(rep) != iana.StatusSuccess {
		t.Fatalf("DECLINE by the holder: %v", rep)
	}
	ip3, _ := fx.lease(t, fx.s, duid(mac(1)), pxe6)
	if ip3 == ip {
		t.Fatal("declined address handed out again at once")
	}
}

func TestConfirm(t *testing.T) {
	fx := newFixture(t)
	on := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeConfirm, duid(mac(1)), plain6, ia(1, netip.MustParseAddr("fd00:c0::150"))))
	off := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeConfirm, duid(mac(1)), plain6, ia(1, netip.MustParseAddr("2001:db8::1"))))
	none := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeConfirm, duid(mac(1)), plain6, ia(1)))
	if on.Options.Status().StatusCode != iana.StatusSuccess || off.Options.Status().StatusCode != iana.StatusNotOnLink || none != nil {
		t.Fatalf("CONFIRM: on %v, off %v, none %v", on, off, none)
	}
}

func relayed(t testing.TB, inner dhcpv6.DHCPv6, hops uint8, link string, opts ...dhcpv6.Option) *dhcpv6.RelayMessage {
	t.Helper()
	r := &dhcpv6.RelayMessage{MessageType: dhcpv6.MessageTypeRelayForward, HopCount: hops, LinkAddr: net.ParseIP(link), PeerAddr: net.ParseIP("fe80::1234")}
	for _, o := range opts {
		r.Options.Add(o)
	}
	r.Options.Add(dhcpv6.OptRelayMessage(inner))
	return r
}

func TestRelay(t *testing.T) {
	fx := newFixture(t)
	relayPeer := netip.MustParseAddrPort("[fd00:99::1]:547")
	uuid := &dhcpv6.DUIDUUID{UUID: [16]byte{9}}
	sol := msg(t, dhcpv6.MessageTypeSolicit, uuid, pxe6, ia(1))
	fwd := relayed(t, sol, 0, "fd00:99::1", dhcpv6.OptInterfaceID([]byte("port-7")),
		dhcpv6.OptClientLinkLayerAddress(iana.HWTypeEthernet, mac(9)))
	d := fx.ask(t, fx.s, fwd, relayPeer)
	rr, ok := d.(*dhcpv6.RelayMessage)
	if !ok || rr.MessageType != dhcpv6.MessageTypeRelayReply {
		t.Fatalf("relayed SOLICIT answered %v", d)
	}
	if string(rr.Options.InterfaceID()) != "port-7" || !rr.PeerAddr.Equal(net.ParseIP("fe80::1234")) {
		t.Fatalf("interface-id %q peer %s not echoed", rr.Options.InterfaceID(), rr.PeerAddr)
	}
	inner, err := rr.GetInnerMessage()
	if err != nil {
		t.Fatal(err)
	}
	if ip := addrOf(t, inner); !relayRange().Contains(ip) {
		t.Fatalf("relayed client offered %s", ip)
	}
	if _, err := fx.inv.MachineByMAC(fx.ctx, mac(9).String()); err != nil {
		t.Fatalf("option 79's MAC is no machine: %v", err)
	}
	// Two relays: both layers answered, outermost first.
	two := relayed(t, relayed(t, sol, 0, "fd00:99::1", dhcpv6.OptInterfaceID([]byte("in"))), 1, "fd00:aa::1", dhcpv6.OptInterfaceID([]byte("out")))
	d = fx.ask(t, fx.s, two, relayPeer)
	if rr, ok := d.(*dhcpv6.RelayMessage); !ok || string(rr.Options.InterfaceID()) != "out" {
		t.Fatalf("two relays answered %v", d)
	}
	// A hop count over the limit, a link no range serves, a Relay-Reply
	// from the LAN: silence.
	for name, m := range map[string]dhcpv6.DHCPv6{
		"hop count 8":   relayed(t, sol, 8, "fd00:99::1"),
		"unknown link":  relayed(t, sol, 0, "fd00:77::1"),
		"nine relays":   nest(t, sol, 9),
		"a relay-reply": &dhcpv6.RelayMessage{MessageType: dhcpv6.MessageTypeRelayReply, LinkAddr: net.ParseIP("fd00:99::1"), PeerAddr: net.IPv6zero},
	} {
		if d := fx.ask(t, fx.s, m, relayPeer); d != nil {
			t.Fatalf("%s answered %v", name, d)
		}
	}
}

func nest(t testing.TB, m dhcpv6.DHCPv6, n int) dhcpv6.DHCPv6 {
	for range n {
		m = relayed(t, m, 0, "fd00:99::1")
	}
	return m
}

// Bounds: the lease table cap, the per-client budget and the packet size.
func TestBounds(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.MaxLeases = 2 })
	fx.lease(t, fx.s, duid(mac(1)), plain6)
	fx.lease(t, fx.s, duid(mac(2)), plain6)
	adv := fx.askMsg(t, fx.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(3)), plain6, ia(1)))
	if iaStatus(adv) != iana.StatusNoAddrsAvail {
		t.Fatalf("third client past the cap answered %v", adv)
	}
	if n := fx.s.leases.count(); n != 2 {
		t.Fatalf("%d lease records, cap 2", n)
	}

	now := time.Unix(1e9, 0)
	fx2 := newFixture(t, func(c *Config) { c.ClientRate, c.ClientBurst, c.Now = 1, 3, func() time.Time { return now } })
	answered := 0
	for range 10 {
		if fx2.askMsg(t, fx2.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(5)), plain6, ia(1))) != nil {
			answered++
		}
	}
	if answered != 3 || fx2.s.Counters().Limited != 7 {
		t.Fatalf("burst 3: answered %d, limited %d", answered, fx2.s.Counters().Limited)
	}
	if fx2.askMsg(t, fx2.s, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(6)), plain6, ia(1))) == nil {
		t.Fatal("another client was limited too")
	}
	big := make([]byte, MaxPacket+1)
	big[0] = byte(dhcpv6.MessageTypeSolicit)
	if _, _, ok := fx.s.Respond(fx.ctx, big, clientPeer); ok || fx.s.Counters().Malformed == 0 {
		t.Fatal("oversized packet answered or not counted")
	}
}

// Run answers over a real UDP socket (loopback).
func TestRunOverUDP(t *testing.T) {
	fx := newFixture(t)
	ctx, cancel := context.WithCancel(fx.ctx)
	done := make(chan error, 1)
	go func() { done <- fx.s.Run(ctx) }()
	c, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sol := msg(t, dhcpv6.MessageTypeSolicit, duid(mac(1)), ipxe6, ia(1))
	if _, err := c.WriteTo(sol.ToBytes(), fx.s.Addr()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	adv, err := dhcpv6.MessageFromBytes(buf[:n])
	if err != nil || adv.MessageType != dhcpv6.MessageTypeAdvertise || !strings.Contains(adv.Options.BootFileURL(), "boot.ipxe") {
		t.Fatalf("answer %v %v", adv, err)
	}
	// Garbage is dropped and counted, never answered.
	_, _ = c.WriteTo([]byte{1, 2}, fx.s.Addr())
	deadline := time.Now().Add(5 * time.Second)
	for fx.s.Counters().Malformed == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if fx.s.Counters().Malformed == 0 {
		t.Fatal("garbage not counted")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
