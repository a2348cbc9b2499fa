package dhcp6

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv6"
)

type countObserver struct {
	mu sync.Mutex
	n  map[[2]string]int
}

func (c *countObserver) Packet(t, o string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[[2]string]int{}
	}
	c.n[[2]string{t, o}]++
}

// TestObserverAndRelayFrom: every datagram is counted by client message
// type and outcome; a Relay-Forward from outside RelayFrom is refused
// (counted, no answer) while one from an allowed relay is served; the
// range gauges count bound and free addresses.
func TestObserverAndRelayFrom(t *testing.T) {
	obs := &countObserver{}
	fx := newFixture(t, func(c *Config) {
		c.Observer = obs
		c.RelayFrom = []netip.Prefix{netip.MustParsePrefix("fd00:99::1/128")}
	})
	sol := msg(t, dhcpv6.MessageTypeSolicit, duid(mac(1)), pxe6, ia(1))
	if fx.ask(t, fx.s, sol, clientPeer) == nil {
		t.Fatal("SOLICIT not answered")
	}
	rc := msg(t, dhcpv6.MessageTypeSolicit, duid(mac(2)), pxe6, ia(1), &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	if fx.ask(t, fx.s, rc, clientPeer) == nil {
		t.Fatal("Rapid Commit SOLICIT not answered")
	}
	fwd := relayed(t, msg(t, dhcpv6.MessageTypeSolicit, duid(mac(3)), pxe6, ia(1)), 0, "fd00:99::1")
	if d := fx.ask(t, fx.s, fwd, netip.MustParseAddrPort("[fe80::66]:547")); d != nil {
		t.Fatalf("Relay-Forward from a link-local source outside RelayFrom answered: %v", d)
	}
	if d := fx.ask(t, fx.s, fwd, netip.MustParseAddrPort("[fd00:99::2]:547")); d != nil {
		t.Fatalf("Relay-Forward from fd00:99::2 (not allowed) answered: %v", d)
	}
	if d := fx.ask(t, fx.s, fwd, netip.MustParseAddrPort("[fd00:99::1]:547")); d == nil {
		t.Fatal("Relay-Forward from the allowed relay not answered")
	}
	fx.s.Respond(fx.ctx, []byte{1, 2}, clientPeer)
	if got := fx.s.Counters().RelayRefused; got != 2 {
		t.Errorf("RelayRefused %d, want 2", got)
	}
	for k, want := range map[[2]string]int{
		{"solicit", OutcomeAdvertise}:          2, // plain, relayed
		{"solicit", OutcomeReply}:              1, // rapid commit
		{"relay-forward", OutcomeRelayRefused}: 2,
		{"other", OutcomeMalformed}:            1,
	} {
		if obs.n[k] != want {
			t.Errorf("observer %v: %d, want %d (all: %v)", k, obs.n[k], want, obs.n)
		}
	}
	stats := fx.s.LeaseStats()
	if len(stats) != 2 {
		t.Fatalf("stats %v", stats)
	}
	// Local range: 256 addresses, one bound (rapid commit), one offered.
	if s := stats[0]; s.Range != "fd00:c0::100-fd00:c0::1ff" || s.Bound != 1 || s.Free != 254 {
		t.Errorf("local range %+v, want 1 bound, 254 free", s)
	}
	// Relayed range: 3 addresses, one offered (ADVERTISE, not bound).
	if s := stats[1]; s.Bound != 0 || s.Free != 2 {
		t.Errorf("relayed range %+v, want 0 bound, 2 free", s)
	}
	if n := rangeSize(Range{Start: netip.MustParseAddr("fd00::"), End: netip.MustParseAddr("fd00::ffff:ffff:ffff:ffff")}); n != 1<<64 {
		t.Errorf("a /64's size %g", n)
	}
}
