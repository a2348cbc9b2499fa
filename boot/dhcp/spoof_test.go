package dhcp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// Tests of full mode under spoofing: RFC 2131 §4.3.2 request states,
// DECLINE rules, the discovered-machine cap and rate-limited warnings.

var relayGW = net.IPv4(10, 9, 0, 1)

// relayed sets giaddr when via is true.
func relayed(via bool) dhcpv4.Modifier {
	return func(d *dhcpv4.DHCPv4) {
		if via {
			d.GatewayIPAddr = relayGW
		}
	}
}

// leaseOf returns the stored lease of ip, or nil.
func (f *fixture) leaseOf(t testing.TB, ip net.IP) *bootv1.Lease {
	t.Helper()
	var l bootv1.Lease
	_, err := record.Get(f.ctx, f.st, LeasePrefix+ip.String(), &l)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &l
}

func (f *fixture) leaseCount(t testing.TB) int {
	t.Helper()
	kvs, err := f.st.List(f.ctx, LeasePrefix)
	if err != nil {
		t.Fatal(err)
	}
	return len(kvs)
}

// doraVia is dora, relayed when via is true; it returns the ACKed address.
func (f *fixture) doraVia(t testing.TB, hw net.HardwareAddr, via bool, mods ...dhcpv4.Modifier) net.IP {
	t.Helper()
	offer, _ := f.do(t, discover(t, hw, biosPXE, append([]dhcpv4.Modifier{relayed(via)}, mods...)...))
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("no OFFER for %s: %v", hw, offer)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, append([]dhcpv4.Modifier{relayed(via)}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	ack, _ := f.do(t, req)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("no ACK for %s: %v", hw, ack)
	}
	return ack.YourIPAddr
}

func msgType(m *dhcpv4.DHCPv4) string {
	if m == nil {
		return "none"
	}
	return m.MessageType().String()
}

func TestRequestStates(t *testing.T) {
	holder, other, stranger := mac(0x100), mac(0x101), mac(0x102)
	for name, tc := range map[string]struct {
		via bool
		// build makes the request; held is holder's address, taken
		// other's; free an address nobody holds.
		build func(held, taken, free net.IP) *dhcpv4.DHCPv4
		want  string // reply type
		// wantLeases is how many leases the store holds afterwards (two
		// from the setup).
		wantLeases int
		timeline   string // on the sender's timeline
	}{
		"init-reboot, no lease here, free address: silent": {
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 {
				return initReboot(stranger, free)
			},
			want: "none", wantLeases: 2, timeline: "from a client with no lease here: not answered",
		},
		"init-reboot, no lease here, another client's address: silent": {
			build: func(_, taken, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(stranger, taken) },
			want:  "none", wantLeases: 2,
		},
		"init-reboot, no lease here, in the subnet outside the range: silent": {
			build: func(_, _, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(stranger, net.IPv4(10, 0, 0, 20)) },
			want:  "none", wantLeases: 2,
		},
		"init-reboot, no lease here, wrong network: NAK": {
			build: func(_, _, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(stranger, net.IPv4(192, 168, 7, 7)) },
			want:  "NAK", wantLeases: 2, timeline: "is not in range",
		},
		"init-reboot, its own address: ACK": {
			build: func(held, _, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(holder, held) },
			want:  "ACK", wantLeases: 2, timeline: "(init-reboot)",
		},
		"init-reboot, lease on another address: NAK": {
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 { return initReboot(holder, free) },
			want:  "NAK", wantLeases: 2, timeline: "is not this client's address",
		},
		"init-reboot, another client's address: NAK": {
			build: func(_, taken, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(holder, taken) },
			want:  "NAK", wantLeases: 2,
		},
		"relayed init-reboot, no lease here: silent": {
			via:   true,
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 { return initReboot(stranger, free) },
			want:  "none", wantLeases: 2,
		},
		"relayed init-reboot, its own address: ACK": {
			via:   true,
			build: func(held, _, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(holder, held) },
			want:  "ACK", wantLeases: 2,
		},
		"relayed init-reboot, local range's address: NAK (wrong network)": {
			via:   true,
			build: func(_, _, _ net.IP) *dhcpv4.DHCPv4 { return initReboot(holder, net.IPv4(10, 0, 0, 150)) },
			want:  "NAK", wantLeases: 2, timeline: "belongs to another subnet",
		},
		"renewing its own address: ACK": {
			build: func(held, _, _ net.IP) *dhcpv4.DHCPv4 { return renew(holder, held) },
			want:  "ACK", wantLeases: 2, timeline: "(renewing)",
		},
		"renewing without a lease: NAK, nothing written": {
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 { return renew(stranger, free) },
			want:  "NAK", wantLeases: 2, timeline: "is not leased to this client",
		},
		"renewing another client's address: NAK": {
			build: func(_, taken, _ net.IP) *dhcpv4.DHCPv4 { return renew(stranger, taken) },
			want:  "NAK", wantLeases: 2,
		},
		"selecting an address never offered: NAK, nothing written": {
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 { return selecting(stranger, free) },
			want:  "NAK", wantLeases: 2, timeline: "was not offered to this client",
		},
		"selecting another client's address: NAK": {
			build: func(_, taken, _ net.IP) *dhcpv4.DHCPv4 { return selecting(stranger, taken) },
			want:  "NAK", wantLeases: 2, timeline: "is leased to another client",
		},
		"relayed selecting never offered: NAK": {
			via:   true,
			build: func(_, _, free net.IP) *dhcpv4.DHCPv4 { return selecting(stranger, free) },
			want:  "NAK", wantLeases: 2,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, ModeFull)
			held := f.doraVia(t, holder, tc.via)
			taken := f.doraVia(t, other, tc.via)
			free := net.IPv4(10, 0, 0, 180)
			if tc.via {
				free = net.IPv4(10, 9, 0, 102)
			}
			m := tc.build(held, taken, free)
			relayed(tc.via)(m)
			rep, dst := f.do(t, m)
			if got := msgType(rep); got != tc.want {
				t.Fatalf("reply %s, want %s", got, tc.want)
			}
			if tc.via && rep != nil && dst.String() != "10.9.0.1:67" {
				t.Errorf("relayed reply sent to %v, want the relay", dst)
			}
			if rep != nil && rep.MessageType() == dhcpv4.MessageTypeAck && !rep.YourIPAddr.Equal(held) {
				t.Errorf("ACK for %s, want %s", rep.YourIPAddr, held)
			}
			if n := f.leaseCount(t); n != tc.wantLeases {
				t.Errorf("%d leases stored, want %d", n, tc.wantLeases)
			}
			if l := f.leaseOf(t, taken); l.GetMac() != other.String() {
				t.Errorf("the other client's lease changed: %v", l)
			}
			if tc.timeline != "" {
				if tl := f.timeline(t, m.ClientHWAddr); !strings.Contains(tl, tc.timeline) {
					t.Errorf("timeline of %s lacks %q:\n%s", m.ClientHWAddr, tc.timeline, tl)
				}
			}
		})
	}
}

func initReboot(hw net.HardwareAddr, ip net.IP) *dhcpv4.DHCPv4 {
	m, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(hw),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)))
	biosPXE(m)
	return m
}

func renew(hw net.HardwareAddr, ip net.IP) *dhcpv4.DHCPv4 {
	m, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(hw), dhcpv4.WithClientIP(ip))
	biosPXE(m)
	return m
}

func selecting(hw net.HardwareAddr, ip net.IP) *dhcpv4.DHCPv4 {
	m, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(hw),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4(serverIP))), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)))
	biosPXE(m)
	return m
}

func decline(hw net.HardwareAddr, ip net.IP, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	m, _ := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithHwAddr(hw),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4(serverIP)))}, mods...)...)
	return m
}

// TestInitRebootLeaseFromStore: a lease that is only in the store (a
// restarted server, another writer) is found: the client is ACKed, not
// ignored.
func TestInitRebootLeaseFromStore(t *testing.T) {
	f := newFixture(t, ModeFull)
	a := mac(0x200)
	ip := f.doraVia(t, a, false)
	restarted := &fixture{s: mustNew(t, f), st: f.st, inv: f.inv, ctx: f.ctx}
	if r, _ := restarted.do(t, initReboot(a, ip)); msgType(r) != "ACK" {
		t.Fatalf("after restart: %s", msgType(r))
	}
	// Written by another writer after this server loaded.
	b, other := mac(0x201), net.IPv4(10, 0, 0, 190)
	l := &bootv1.Lease{Ip: other.String(), Mac: b.String(), State: bootv1.Lease_STATE_ACTIVE, ExpiresUnix: time.Now().Add(time.Hour).Unix(),
		Subnet: localRange().Subnet.String()}
	if _, err := record.Put(f.ctx, f.st, LeasePrefix+other.String(), l, 0); err != nil {
		t.Fatal(err)
	}
	if r, _ := restarted.do(t, initReboot(b, other)); msgType(r) != "ACK" || !r.YourIPAddr.Equal(other) {
		t.Fatalf("lease written by another writer: %s %v", msgType(r), r)
	}
}

func TestDeclineRules(t *testing.T) {
	holder, other, stranger := mac(0x300), mac(0x301), mac(0x302)
	withCID := func(id string) dhcpv4.Modifier {
		return dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionClientIdentifier, []byte(id)))
	}
	type setup struct{ held, offered, free net.IP }
	for name, tc := range map[string]struct {
		via       bool
		cid       string // holder's client identifier in its DORA
		build     func(s setup) *dhcpv4.DHCPv4
		quarantin bool   // the declined address is quarantined
		timeline  string // on the sender's timeline
	}{
		"holder declines its lease": {
			build:     func(s setup) *dhcpv4.DHCPv4 { return decline(holder, s.held) },
			quarantin: true, timeline: "dhcp decline DECLINE",
		},
		"client declines the address it was offered": {
			build:     func(s setup) *dhcpv4.DHCPv4 { return decline(other, s.offered) },
			quarantin: true,
		},
		"relayed holder declines its lease": {
			via:       true,
			build:     func(s setup) *dhcpv4.DHCPv4 { return decline(holder, s.held, relayed(true)) },
			quarantin: true,
		},
		"holder with its client identifier": {
			cid:       "id-1",
			build:     func(s setup) *dhcpv4.DHCPv4 { return decline(holder, s.held, withCID("id-1")) },
			quarantin: true,
		},
		"holder's MAC with another client identifier: ignored": {
			cid:      "id-1",
			build:    func(s setup) *dhcpv4.DHCPv4 { return decline(holder, s.held, withCID("id-2")) },
			timeline: "neither holds nor was offered",
		},
		"a MAC that holds nothing declines a free address: ignored": {
			build:    func(s setup) *dhcpv4.DHCPv4 { return decline(stranger, s.free) },
			timeline: "neither holds nor was offered",
		},
		"a MAC that holds nothing declines another's lease: ignored": {
			build:    func(s setup) *dhcpv4.DHCPv4 { return decline(stranger, s.held) },
			timeline: "dhcp ignored DECLINE",
		},
		"relayed DECLINE of a free address from a MAC that holds nothing: ignored": {
			via:   true,
			build: func(s setup) *dhcpv4.DHCPv4 { return decline(stranger, s.free, relayed(true)) },
		},
		"a holder's DECLINE naming another server: ignored": {
			build: func(s setup) *dhcpv4.DHCPv4 {
				d := decline(holder, s.held)
				d.UpdateOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2)))
				return d
			},
			timeline: "not ours",
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, ModeFull)
			var mods []dhcpv4.Modifier
			if tc.cid != "" {
				mods = append(mods, withCID(tc.cid))
			}
			s := setup{held: f.doraVia(t, holder, tc.via, mods...), free: net.IPv4(10, 0, 0, 180)}
			if tc.via {
				s.free = net.IPv4(10, 9, 0, 102)
			}
			o, _ := f.do(t, discover(t, other, biosPXE, relayed(tc.via)))
			s.offered = o.YourIPAddr
			m := tc.build(s)
			before := map[string]*bootv1.Lease{}
			for _, ip := range []net.IP{s.held, s.offered, s.free} {
				before[ip.String()] = f.leaseOf(t, ip)
			}
			if r, _ := f.do(t, m); r != nil {
				t.Fatalf("DECLINE answered: %v", r)
			}
			ip := m.RequestedIPAddress()
			l := f.leaseOf(t, ip)
			if tc.quarantin {
				if l.GetState() != bootv1.Lease_STATE_DECLINED || l.GetMac() != "" {
					t.Fatalf("declined address %s: %v", ip, l)
				}
				if o, _ := f.do(t, discover(t, mac(0x3ff), plain, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)), relayed(tc.via))); o.YourIPAddr.Equal(ip) {
					t.Errorf("quarantined %s offered again", ip)
				}
			} else {
				for k, was := range before {
					if diff := cmp.Diff(was.String(), f.leaseOf(t, net.ParseIP(k)).String()); diff != "" {
						t.Errorf("lease of %s changed by an ignored DECLINE (-before +after):\n%s", k, diff)
					}
				}
				// The address is not quarantined: a client asking for it
				// gets it (unless it is someone's lease).
				if ip.Equal(s.free) {
					if o, _ := f.do(t, discover(t, mac(0x3fe), plain, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)), relayed(tc.via))); !o.YourIPAddr.Equal(ip) {
						t.Errorf("after an ignored DECLINE %s is not offered (got %s)", ip, o.YourIPAddr)
					}
				}
			}
			if tc.timeline != "" {
				if tl := f.timeline(t, m.ClientHWAddr); !strings.Contains(tl, tc.timeline) {
					t.Errorf("timeline of %s lacks %q:\n%s", m.ClientHWAddr, tc.timeline, tl)
				}
			}
		})
	}
}

// TestQuarantineDoesNotExhaust: a quarantined address is still handed
// out when the range has nothing else; before that, it is skipped.
func TestQuarantineDoesNotExhaust(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Ranges = []Range{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.101")}}
		c.DeclineQuarantine = time.Hour
	})
	a, b, c := mac(0x400), mac(0x401), mac(0x402)
	ipA := f.doraVia(t, a, false)
	if r, _ := f.do(t, decline(a, ipA)); r != nil {
		t.Fatal("DECLINE answered")
	}
	ipB := f.doraVia(t, b, false)
	if ipB.Equal(ipA) {
		t.Fatalf("quarantined %s handed out while another address was free", ipA)
	}
	if ipC := f.doraVia(t, c, false); !ipC.Equal(ipA) {
		t.Fatalf("range exhausted but for the quarantined %s: got %s", ipA, ipC)
	}
	if l := f.leaseOf(t, ipA); l.GetMac() != c.String() || l.GetState() != bootv1.Lease_STATE_ACTIVE {
		t.Fatalf("lease after reuse: %v", l)
	}
}

// TestDiscoveredCap: past inventory's cap a network-booting unknown MAC is
// answered like a plain client (an address, no boot file) and gets no
// machine; known machines boot as before.
func TestDiscoveredCap(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) {
		inv, err := inventory.New(inventory.Config{Store: c.Store, MaxDiscovered: 2})
		if err != nil {
			t.Fatal(err)
		}
		c.Inventory, c.Timeline = inv, inv
	})
	inv := f.s.cfg.Inventory.(*inventory.Inventory)
	f.inv = inv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { inv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := range 2 {
		if o, _ := f.do(t, discover(t, mac(0x500+i), biosPXE)); o.BootFileName != "undionly.kpxe" {
			t.Fatalf("client %d under the cap: boot file %q", i, o.BootFileName)
		}
	}
	over := mac(0x5ff)
	o, _ := f.do(t, discover(t, over, biosPXE))
	if o == nil || !localRange().Contains(addrOf(o.YourIPAddr)) || o.BootFileName != "" {
		t.Fatalf("client over the cap: %v", o)
	}
	req, _ := dhcpv4.NewRequestFromOffer(o)
	biosPXE(req)
	if a, _ := f.do(t, req); msgType(a) != "ACK" || a.BootFileName != "" {
		t.Fatalf("client over the cap: want an ACK without a boot file, got %v", a)
	}
	if _, err := inv.MachineByMAC(ctx, over.String()); err == nil {
		t.Error("a machine was recorded past the cap")
	}
	if tl := f.timeline(t, over); !strings.Contains(tl, "inventory_error:") || !strings.Contains(tl, "boot none") {
		t.Errorf("timeline of the client over the cap:\n%s", tl)
	}
	if o, _ := f.do(t, discover(t, mac(0x500), biosPXE)); o.BootFileName != "undionly.kpxe" {
		t.Errorf("known machine at the cap: boot file %q", o.BootFileName)
	}
}

func TestLogLimiter(t *testing.T) {
	var buf syncbuf.Buffer
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	l := newLogLimiter(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute, clock)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); l.Warn(logDeclineIgnored, "decline ignored", "mac", "m") }()
	}
	wg.Wait()
	l.Warn(logNak, "nak", "mac", "m")
	now = now.Add(59 * time.Second)
	l.Warn(logDeclineIgnored, "decline ignored", "mac", "m")
	now = now.Add(time.Second)
	l.Warn(logDeclineIgnored, "decline ignored", "mac", "m")
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		_, after, _ := strings.Cut(line, "level=")
		got = append(got, after)
	}
	want := []string{
		"WARN msg=\"decline ignored\" mac=m",
		"WARN msg=nak mac=m",
		"WARN msg=\"decline ignored\" mac=m suppressed=50",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// TestSpoofedFloodLogsLittle: a flood of DECLINEs and INIT-REBOOTs from
// spoofed MACs writes a few log lines, not one per packet.
func TestSpoofedFloodLogsLittle(t *testing.T) {
	var buf syncbuf.Buffer
	f := newFixture(t, ModeFull, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	for i := range 300 {
		f.do(t, decline(mac(0x600+i), net.IPv4(10, 0, 0, byte(100+i%100))))
		f.do(t, initReboot(mac(0x900+i), net.IPv4(10, 0, 0, byte(100+i%100))))
	}
	if n := strings.Count(buf.String(), "\n"); n > 4 {
		t.Errorf("%d log lines for 600 spoofed packets:\n%s", n, buf.String())
	}
	if f.leaseCount(t) != 0 {
		t.Errorf("spoofed packets wrote %d leases", f.leaseCount(t))
	}
}
