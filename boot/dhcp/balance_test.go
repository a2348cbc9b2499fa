package dhcp

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/corralhq/corral/inventory"
)

// TestBalanceLeavesDISCOVERs: with Config.Balance set, a DISCOVER it says
// another appliance answers is left alone — no OFFER, no timeline entry,
// no machine record, the outcome left_to_peer — and the same client's
// REQUEST, a DISCOVER it keeps, and a DISCOVER with secs past the
// threshold are answered. Balance is asked with the client's MAC, the
// range's subnet and the secs field.
func TestBalanceLeavesDISCOVERs(t *testing.T) {
	o := &fakeObserver{seen: map[[2]string]int{}}
	var mu sync.Mutex
	type ask struct {
		mac    string
		subnet netip.Prefix
		secs   uint16
	}
	var asked []ask
	left := mac(1).String()
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Observer = o
		c.Balance = func(m string, subnet netip.Prefix, secs uint16) bool {
			mu.Lock()
			asked = append(asked, ask{m, subnet, secs})
			mu.Unlock()
			return m != left || secs >= 3
		}
	})
	sock, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	conn := &sentConn{PacketConn: sock, sent: map[[4]byte][]byte{}}
	send := func(m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
		t.Helper()
		p, err := dhcpv4.FromBytes(m.ToBytes())
		if err != nil {
			t.Fatal(err)
		}
		f.s.handle(job{conn: conn, up: &net.UDPAddr{IP: net.IPv4zero, Port: 68}, m: p, port: dhcpv4.ServerPort})
		conn.mu.Lock()
		defer conn.mu.Unlock()
		b, ok := conn.sent[m.TransactionID]
		if !ok {
			return nil
		}
		r, err := dhcpv4.FromBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	if r := send(discover(t, mac(1), efiPXE)); r != nil {
		t.Fatalf("a DISCOVER left to a peer was answered: %s", r.Summary())
	}
	if o.seen[[2]string{"discover", OutcomeLeft}] != 1 {
		t.Fatalf("outcomes %v: want one discover left_to_peer", o.seen)
	}
	if tl := f.timeline(t, mac(1)); tl != "" {
		t.Fatalf("a DISCOVER left to a peer wrote the timeline:\n%s", tl)
	}
	if _, err := f.inv.GetMachine(f.ctx, inventory.MachineNameForMAC(left)); err == nil {
		t.Fatal("a DISCOVER left to a peer recorded the machine")
	}
	if len(asked) != 1 || asked[0].mac != left || asked[0].subnet != localRange().Subnet || asked[0].secs != 0 {
		t.Fatalf("Balance asked %+v", asked)
	}

	// Waited long enough: answered; and its REQUEST is never balanced.
	late := discover(t, mac(1), efiPXE)
	late.NumSeconds = 4
	offer := send(late)
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("secs 4: %v", offer)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer)
	if err != nil {
		t.Fatal(err)
	}
	efiPXE(req)
	if ack := send(req); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("REQUEST: %v", ack)
	}
	if r := send(discover(t, mac(2), efiPXE)); r == nil || r.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("a DISCOVER this appliance keeps: %v", r)
	}
	if _, err := f.inv.GetMachine(f.ctx, inventory.MachineNameForMAC(mac(2).String())); err != nil {
		t.Fatalf("a DISCOVER this appliance keeps records the machine: %v", err)
	}
	if n := len(asked); n != 3 {
		t.Fatalf("Balance asked %d times for 3 DISCOVERs and a REQUEST: %+v", n, asked)
	}
}
