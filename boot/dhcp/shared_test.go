package dhcp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/leaseholds"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/require"
)

// Tests of full mode with several appliances on one store and one
// segment: every appliance sees every broadcast, offers from its own view
// and binds by compare-and-swap in the shared store.

// sharedStores are the stores several appliances can share: the
// in-memory one (the logic) and a real three-member etcd cluster (what a
// fleet runs on; skipped outside CI when etcd is not installed), started
// once for the parent test t, one prefix per subtest.
func sharedStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	var cluster *etcdtest.Cluster
	n := 0
	return map[string]func(t *testing.T) store.Store{
		"mem": func(t *testing.T) store.Store { return mem.New() },
		"etcd": func(sub *testing.T) store.Store {
			require.Tool(sub, "etcd")
			if cluster == nil {
				c, err := etcdtest.Start(t.TempDir(), 3)
				if err != nil {
					sub.Fatalf("etcd cluster: %v", err)
				}
				t.Cleanup(c.Stop)
				cluster = c
			}
			n++
			st, err := etcd.Open(context.Background(), etcd.Options{Endpoints: cluster.Endpoints(), Prefix: fmt.Sprintf("/dhcp%d", n)})
			if err != nil {
				sub.Fatal(err)
			}
			sub.Cleanup(func() { st.Close() })
			return st
		},
	}
}

// appliance is one DHCP server of a fleet, with its own inventory on the
// shared store.
type appliance struct {
	*fixture
	ip netip.Addr
}

// newAppliance makes a full-mode server at ip on st; with run it serves
// (on loopback sockets nobody sends to) and so follows the other
// appliances' leases.
func newAppliance(t *testing.T, st store.Store, ip string, run bool, mutate ...func(*Config)) *appliance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() { defer wg.Done(); inv.Run(ctx) }()
	c1, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	c2, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	cfg := Config{Mode: ModeFull, ServerIP: netip.MustParseAddr(ip), Ranges: []Range{localRange(), relayRange()}, Catalog: fullCatalog,
		Store: st, Inventory: inv, Timeline: inv, Conn: c1, PXEConn: c2, LeaseTime: time.Hour}
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if run {
		wg.Add(1)
		go func() { defer wg.Done(); s.Run(ctx) }()
	} else {
		t.Cleanup(func() { s.Close() })
	}
	return &appliance{fixture: &fixture{s: s, st: st, inv: inv, ctx: ctx}, ip: cfg.ServerIP}
}

// learns waits until a's view has ip as hw's lease (it arrives through
// a's watch of the store).
func learns(t *testing.T, a *appliance, ip net.IP, hw net.HardwareAddr) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m, ok := a.s.leases.Owner(addrOf(ip)); ok && m == hw.String() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not learn %s's lease on %s within 10s", a.ip, hw, ip)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// liveLeases returns, from the store, every active unexpired lease: IP →
// MAC.
func liveLeases(t *testing.T, st store.Store) map[string]string {
	t.Helper()
	ls, err := record.List(context.Background(), st, LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range ls {
		if live(l, time.Now()) {
			out[l.GetIp()] = l.GetMac()
		}
	}
	return out
}

// TestSharedStoreStaleViews: what a stale view of the other appliance's
// leases can and cannot do. An appliance learns the other's bindings
// through its watch and offers a client its lease from there (sticky
// across appliances), and never offers another client's live lease; an
// appliance whose view is stale (no watch yet) can neither bind a taken
// address (its write conflicts, the client is NAKed) nor bind a client
// a second live address (its write conflicts on the client's holder
// record: NAKed, and offered its lease next); a client bound by one appliance renews, rebinds and reboots
// through the other.
func TestSharedStoreStaleViews(t *testing.T) {
	for name, open := range sharedStores(t) {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			a := newAppliance(t, st, "10.0.0.1", true)
			b := newAppliance(t, st, "10.0.0.2", true)
			// c and d never follow: their view is the store as it was
			// when they started.
			c := newAppliance(t, st, "10.0.0.3", false)
			d := newAppliance(t, st, "10.0.0.4", false)

			m1, m2, m3 := mac(0x101), mac(0x102), mac(0x103)
			// m1 asks a for .120 (not the range's first address, which
			// an appliance knowing nothing would offer anyway).
			x := a.doraVia(t, m1, false, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 120))))
			// b learns m1's lease: it offers it to m1, and not to m3
			// even when m3 asks for it.
			learns(t, b, x, m1)
			if o, _ := b.do(t, discover(t, m1, biosPXE)); msgType(o) != "OFFER" || !o.YourIPAddr.Equal(x) {
				t.Fatalf("b answered m1 (lease %s) with %v", x, o)
			}
			if o, _ := b.do(t, discover(t, m3, biosPXE, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(x)))); msgType(o) != "OFFER" || o.YourIPAddr.Equal(x) {
				t.Fatalf("b answered m3 asking for m1's live lease %s with %v", x, o)
			}
			// c's stale view offers x to m2, who asks for it; m2's
			// REQUEST is NAKed and nothing is written.
			o, _ := c.do(t, discover(t, m2, biosPXE, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(x))))
			if o == nil || !o.YourIPAddr.Equal(x) {
				t.Fatalf("c (stale) offered %v, want x %s (the test relies on it)", o, x)
			}
			req, _ := dhcpv4.NewRequestFromOffer(o)
			if r, _ := c.do(t, req); msgType(r) != "NAK" {
				t.Fatalf("stale appliance answered m2's REQUEST for m1's %s with %s", x, msgType(r))
			}
			if got := liveLeases(t, st)[x.String()]; got != m1.String() {
				t.Fatalf("store: %s is held by %q, want m1", x, got)
			}
			// d's stale view offers m1 another address; m1's REQUEST for
			// it is NAKed, for the fleet holds m1 on x (one live lease a
			// MAC and subnet: holder.go), nothing is written, and d,
			// having learnt x, offers m1 x when it DISCOVERs again.
			want := net.IPv4(10, 0, 0, 150)
			o, _ = d.do(t, discover(t, m1, biosPXE, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(want))))
			if o == nil || !o.YourIPAddr.Equal(want) {
				t.Fatalf("d (stale) offered m1 %v, want the requested %s (the test relies on it)", o, want)
			}
			req, _ = dhcpv4.NewRequestFromOffer(o)
			if r, _ := d.do(t, req); msgType(r) != "NAK" {
				t.Fatalf("stale appliance answered m1's REQUEST for a second address %s with %s", want, msgType(r))
			}
			if live := liveLeases(t, st); live[want.String()] != "" || live[x.String()] != m1.String() {
				t.Fatalf("store after the NAK: %v; want m1 on %s only", live, x)
			}
			if d.s.Contended() == 0 {
				t.Error("d did not count the refused binding")
			}
			y := d.doraVia(t, m1, false)
			if !y.Equal(x) {
				t.Fatalf("after the NAK d gave m1 %s, want its lease %s", y, x)
			}
			// Renewing (ciaddr), rebinding and INIT-REBOOT of m1's lease
			// through the appliance that did not bind it.
			for name, m := range map[string][]dhcpv4.Modifier{
				"renew":       {dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(m1), dhcpv4.WithClientIP(y)},
				"init-reboot": {dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(m1), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(y))},
			} {
				for _, ap := range []*appliance{a, b} {
					r, _ := dhcpv4.New(m...)
					if ack, _ := ap.do(t, r); msgType(ack) != "ACK" || !ack.YourIPAddr.Equal(y) {
						t.Errorf("%s of m1's %s at %s: %s %v", name, y, ap.ip, msgType(ack), ack)
					}
				}
			}
			// m2 gets neither x (now released but m1's, sticky) while
			// another address is free, nor y.
			got := b.doraVia(t, m2, false)
			if got.Equal(x) || got.Equal(y) {
				t.Errorf("m2 got m1's address %s", got)
			}
			if live := liveLeases(t, st); live[y.String()] != m1.String() || live[got.String()] != m2.String() {
				t.Errorf("store after all: %v", live)
			}
		})
	}
}

// TestSharedSegmentContention: two appliances on one segment with the
// same small range answer every client at once: each client takes the
// first OFFER and REQUESTs it from that server (the other sees its own
// identifier is not chosen and stays silent), retrying from DISCOVER on a
// NAK. With 35 clients for 40 addresses without release, and with 200
// clients over 40 addresses releasing as they go, no address is ever
// ACKed to a second client while the first holds it, and every held
// lease is in the store as ACKed.
func TestSharedSegmentContention(t *testing.T) {
	small := func(c *Config) {
		c.Ranges = []Range{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.139")}}
	}
	for name, open := range sharedStores(t) {
		for wname, w := range map[string]struct {
			clients, parallel int
			release           bool
		}{
			"35 clients on 40 addresses":               {clients: 35, parallel: 35},
			"200 clients over 40 addresses, releasing": {clients: 200, parallel: 30, release: true},
		} {
			t.Run(name+"/"+wname, func(t *testing.T) {
				st := open(t)
				aps := []*appliance{newAppliance(t, st, "10.0.0.1", true, small), newAppliance(t, st, "10.0.0.2", true, small)}
				held := leaseholds.New()
				var naks sync.Map
				sem := make(chan struct{}, w.parallel)
				var wg sync.WaitGroup
				for i := range w.clients {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						hw := mac(0x2000 + i)
						ip, via, n := sharedDORA(t, aps, hw)
						naks.Store(i, n)
						if ip == nil {
							t.Errorf("%s: no lease after 20 tries", hw)
							return
						}
						if other := held.Ack(ip, hw); other != "" {
							t.Errorf("DUPLICATE: %s ACKed to %s while %s holds it", ip, hw, other)
						}
						if !w.release {
							return
						}
						time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
						held.Release(ip, hw)
						rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(hw), dhcpv4.WithClientIP(ip),
							dhcpv4.WithOption(dhcpv4.OptServerIdentifier(via.ip.AsSlice())))
						via.do(t, rel)
					}()
				}
				wg.Wait()
				total := 0
				naks.Range(func(_, v any) bool { total += v.(int); return true })
				t.Logf("%d clients, %d NAKs, superseded %d+%d", w.clients, total, aps[0].s.Superseded(), aps[1].s.Superseded())
				// The store agrees with what the clients hold.
				live := liveLeases(t, st)
				if diff := cmp.Diff(held.Snapshot(), live); diff != "" {
					t.Errorf("store's live leases differ from the ACKs clients hold (-held +store):\n%s", diff)
				}
			})
		}
	}
}

// sharedDORA runs one client's DORA against every appliance at once (a
// broadcast on one segment): the first OFFER wins. It returns the ACKed
// address, the appliance that ACKed it and how many NAKs it took.
func sharedDORA(t *testing.T, aps []*appliance, hw net.HardwareAddr) (net.IP, *appliance, int) {
	naks := 0
	for range 20 {
		d := discover(t, hw, plain)
		type answer struct {
			ap    *appliance
			offer *dhcpv4.DHCPv4
		}
		offers := make(chan answer, len(aps))
		for _, ap := range aps {
			go func() {
				p, _ := dhcpv4.FromBytes(d.ToBytes())
				o, _ := ap.s.Respond(ap.ctx, p, nil, dhcpv4.ServerPort)
				offers <- answer{ap, o}
			}()
		}
		var first answer
		for range aps {
			if a := <-offers; first.offer == nil && a.offer != nil {
				first = a
			}
		}
		if first.offer == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		req, _ := dhcpv4.NewRequestFromOffer(first.offer)
		var ack *dhcpv4.DHCPv4
		for _, ap := range aps { // the REQUEST is broadcast too
			p, _ := dhcpv4.FromBytes(req.ToBytes())
			r, _ := ap.s.Respond(ap.ctx, p, nil, dhcpv4.ServerPort)
			switch {
			case r == nil:
			case ap != first.ap:
				t.Errorf("%s answered a REQUEST for server %s: %s", ap.ip, first.ap.ip, r.MessageType())
			default:
				ack = r
			}
		}
		if ack != nil && ack.MessageType() == dhcpv4.MessageTypeAck {
			return ack.YourIPAddr, first.ap, naks
		}
		naks++
	}
	return nil, nil, naks
}

// TestProxyModeSharedSegment: proxy mode hands out no addresses, so two
// appliances in proxy mode on one segment need no coordination: both
// answer a PXE client's DISCOVER with boot options and no address, and
// neither writes a lease.
func TestProxyModeSharedSegment(t *testing.T) {
	st := mem.New()
	proxy := func(c *Config) { c.Mode = ModeProxy; c.Ranges = nil }
	aps := []*appliance{newAppliance(t, st, "10.0.0.1", true, proxy), newAppliance(t, st, "10.0.0.2", true, proxy)}
	hw := mac(0x301)
	for _, ap := range aps {
		o, _ := ap.do(t, discover(t, hw, biosPXE))
		if msgType(o) != "OFFER" || !o.YourIPAddr.IsUnspecified() || o.BootFileName == "" || !o.ServerIPAddr.Equal(ap.ip.AsSlice()) {
			t.Errorf("%s: proxy answer %v", ap.ip, o)
		}
	}
	if n := aps[0].leaseCount(t); n != 0 {
		t.Errorf("proxy mode wrote %d leases", n)
	}
}

// TestSharedOffers: offers on a segment appliances share. A client
// DISCOVERing again is offered its pending offer; an appliance whose
// offer lost (the client took another appliance's) withdraws it as soon
// as its watch shows the binding; the REQUEST another appliance won is on
// a network-booting client's timeline, not on a plain client's.
func TestSharedOffers(t *testing.T) {
	st := mem.New()
	a := newAppliance(t, st, "10.0.0.1", true)
	b := newAppliance(t, st, "10.0.0.2", true)
	m0, m1 := mac(0x401), mac(0x402)

	// b's cursor moves past a's: the two offer m1 different addresses.
	if o, _ := b.do(t, discover(t, m0, plain)); msgType(o) != "OFFER" {
		t.Fatalf("b: %v", o)
	}
	oa, _ := a.do(t, discover(t, m1, plain))
	ob, _ := b.do(t, discover(t, m1, plain))
	if msgType(oa) != "OFFER" || msgType(ob) != "OFFER" || oa.YourIPAddr.Equal(ob.YourIPAddr) {
		t.Fatalf("offers to m1: a %v, b %v", oa, ob)
	}
	if again, _ := b.do(t, discover(t, m1, plain)); !again.YourIPAddr.Equal(ob.YourIPAddr) {
		t.Errorf("m1 DISCOVERing again: b offered %s, then %s", ob.YourIPAddr, again.YourIPAddr)
	}
	req, _ := dhcpv4.NewRequestFromOffer(oa)
	if r, _ := b.do(t, req); r != nil {
		t.Fatalf("b answered a REQUEST for a: %v", r)
	}
	if r, _ := a.do(t, req); msgType(r) != "ACK" {
		t.Fatalf("a: %v", r)
	}
	learns(t, b, oa.YourIPAddr, m1)
	b.s.leases.mu.Lock()
	_, pending := b.s.leases.offers[addrOf(ob.YourIPAddr)]
	_, of := b.s.leases.offerOf[m1.String()]
	b.s.leases.mu.Unlock()
	if pending || of {
		t.Errorf("b still holds its offer of %s to m1, who took a's", ob.YourIPAddr)
	}
	if tl := b.timeline(t, m1); strings.Contains(tl, "another server") {
		t.Errorf("a plain client's REQUEST for a is on b's timeline:\n%s", tl)
	}
	pxe := mac(0x403)
	o, _ := a.do(t, discover(t, pxe, biosPXE))
	req, _ = dhcpv4.NewRequestFromOffer(o)
	biosPXE(req)
	b.do(t, req)
	if tl := b.timeline(t, pxe); !strings.Contains(tl, "the client chose another server") {
		t.Errorf("a PXE client's REQUEST for a is not on b's timeline:\n%s", tl)
	}
}
