package dhcp

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time       { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration)  { c.ns.Add(int64(d)) }
func oneAddress(c *Config, ck *clock) { c.Ranges = []Range{onlyRange()}; c.Now = ck.now }
func onlyRange() Range {
	r := localRange()
	r.End = r.Start // one address: whoever holds it holds the range
	return r
}

func storedLease(t *testing.T, f *fixture, ip string) *bootv1.Lease {
	t.Helper()
	var l bootv1.Lease
	if _, err := record.Get(f.ctx, f.st, LeasePrefix+ip, &l); err != nil {
		t.Fatal(err)
	}
	return &l
}

// offered is the address f offers hw, or "" when it offers none.
func offered(t *testing.T, f *fixture, hw net.HardwareAddr) string {
	t.Helper()
	offer, _ := f.do(t, discover(t, hw, plain))
	if offer == nil {
		return ""
	}
	return offer.YourIPAddr.String()
}

// TestPin: a pinned lease is its MAC's for good: across a restart and
// past its expiry it is offered to no other MAC, nor reclaimed, released
// or declined; the MAC renewing keeps it; unpinned, it runs out after a
// lease time and goes to the next client.
func TestPin(t *testing.T) {
	ck := newClock()
	f := newFixture(t, ModeFull, func(c *Config) { oneAddress(c, ck) })
	a, b := mac(1), mac(2)
	_, ack := f.dora(t, a, biosPXE)
	ip := ack.YourIPAddr.String()
	const holder = "deployment:d1"

	addr, gw, dns, err := f.s.Pin(f.ctx, strings.ToUpper(a.String()), holder)
	if err != nil {
		t.Fatal(err)
	}
	if addr != netip.MustParsePrefix(ip+"/24") || gw != netip.MustParseAddr("10.0.0.254") || len(dns) != 1 || dns[0] != netip.MustParseAddr("10.0.0.53") {
		t.Errorf("Pin = %s %s %v", addr, gw, dns)
	}
	if l := storedLease(t, f, ip); l.GetPinnedBy() != holder || l.GetMac() != a.String() {
		t.Errorf("stored lease %v", l)
	}
	if again, _, _, err := f.s.Pin(f.ctx, a.String(), holder); err != nil || again != addr {
		t.Errorf("Pin again: %s %v", again, err)
	}
	if _, _, _, err := f.s.Pin(f.ctx, a.String(), "deployment:d2"); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), holder) {
		t.Errorf("another holder's Pin: %v", err)
	}

	// A restart, then well past the lease time: still A's.
	f = &fixture{s: mustNew(t, f), st: f.st, inv: f.inv, ctx: f.ctx}
	ck.add(3 * time.Hour)
	if got := offered(t, f, b); got == ip {
		t.Fatalf("the pinned address was offered to %s after its lease time", b)
	}
	steal, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(b),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice())), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(ip))))
	if r, _ := f.do(t, steal); r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("another MAC's REQUEST for the pinned address: %v", r)
	}

	// RELEASE and DECLINE from A leave the pin in place.
	rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(a), dhcpv4.WithClientIP(net.ParseIP(ip)))
	f.do(t, rel)
	dec, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithHwAddr(a), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(ip))))
	f.do(t, dec)
	if l := storedLease(t, f, ip); l.GetPinnedBy() != holder || l.GetState() != bootv1.Lease_STATE_ACTIVE || l.GetMac() != a.String() {
		t.Fatalf("after RELEASE and DECLINE: %v", l)
	}

	// A renewing keeps its address, and the pin.
	ren, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(a), dhcpv4.WithClientIP(net.ParseIP(ip)))
	if r, _ := f.do(t, ren); r == nil || r.MessageType() != dhcpv4.MessageTypeAck || r.YourIPAddr.String() != ip {
		t.Fatalf("renewal: %v", r)
	}
	if got := offered(t, f, a); got != ip {
		t.Errorf("A is offered %q, want its pinned %s", got, ip)
	}
	if l := storedLease(t, f, ip); l.GetPinnedBy() != holder {
		t.Fatalf("the renewal dropped the pin: %v", l)
	}

	// Another holder's Unpin leaves it alone; the holder's frees it after
	// one lease time.
	if err := f.s.Unpin(f.ctx, a.String(), "deployment:d2"); err != nil {
		t.Fatal(err)
	}
	if l := storedLease(t, f, ip); l.GetPinnedBy() != holder {
		t.Fatalf("another holder unpinned it: %v", l)
	}
	if err := f.s.Unpin(f.ctx, a.String(), holder); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Unpin(f.ctx, a.String(), holder); err != nil {
		t.Fatalf("Unpin twice: %v", err)
	}
	if l := storedLease(t, f, ip); l.GetPinnedBy() != "" || l.GetExpiresUnix() > ck.now().Add(time.Hour).Unix() {
		t.Fatalf("after Unpin: %v", l)
	}
	if got := offered(t, f, b); got == ip {
		t.Fatalf("offered to %s before the unpinned lease ran out", b)
	}
	ck.add(time.Hour + time.Second)
	if got := offered(t, f, b); got != ip {
		t.Errorf("after the unpinned lease ran out %s is offered %q, want %s", b, got, ip)
	}
}

func TestPinRefusals(t *testing.T) {
	f := newFixture(t, ModeFull)
	for name, tc := range map[string]struct {
		mac, holder string
		class       error
		want        string
	}{
		"no lease":   {mac(9).String(), "deployment:x", apierr.ErrPrecondition, "has no DHCP lease"},
		"bad MAC":    {"52:54:00", "deployment:x", apierr.ErrInvalid, "MAC"},
		"no holder":  {mac(9).String(), "", apierr.ErrInvalid, "holder"},
		"bad holder": {mac(9).String(), "a\nb", apierr.ErrInvalid, "holder"},
	} {
		if _, _, _, err := f.s.Pin(f.ctx, tc.mac, tc.holder); !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v with %q", name, err, tc.class, tc.want)
		}
	}
	if err := f.s.Unpin(f.ctx, mac(9).String(), "deployment:x"); err != nil {
		t.Errorf("Unpin without a lease: %v", err)
	}
	p := newFixture(t, ModeProxy)
	if _, _, _, err := p.s.Pin(p.ctx, mac(1).String(), "deployment:x"); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "proxy DHCP: Corral assigns no addresses") {
		t.Errorf("proxy mode Pin: %v", err)
	}
	if err := p.s.Unpin(p.ctx, mac(1).String(), "deployment:x"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Errorf("proxy mode Unpin: %v", err)
	}
}

// TestPinFleet: a pin made on one appliance holds on another sharing the
// store (it learns the pin from its watch of the lease records), and one
// that reads the lease from the store first can pin it too.
func TestPinFleet(t *testing.T) {
	ck := newClock()
	st := mem.New()
	one := newAppliance(t, st, "10.0.0.1", true, func(c *Config) { oneAddress(c, ck) })
	two := newAppliance(t, st, "10.0.0.2", true, func(c *Config) { oneAddress(c, ck) })
	a, b := mac(1), mac(2)
	_, ack := one.dora(t, a, plain)
	learns(t, two, ack.YourIPAddr, a)
	if _, _, _, err := two.s.Pin(two.ctx, a.String(), "deployment:f1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		one.s.leases.mu.Lock()
		pinned := one.s.leases.byIP[addrOf(ack.YourIPAddr)].pinned
		one.s.leases.mu.Unlock()
		if pinned == "deployment:f1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other appliance did not learn the pin")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ck.add(3 * time.Hour)
	for _, ap := range []*appliance{one, two} {
		if got := offered(t, ap.fixture, b); got == ack.YourIPAddr.String() {
			t.Errorf("appliance %s offered the pinned address to another MAC", ap.ip)
		}
	}
	if _, _, _, err := one.s.Pin(one.ctx, a.String(), "deployment:f1"); err != nil {
		t.Errorf("the same holder's Pin on the other appliance: %v", err)
	}
}
