package dhcp

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// sentConn is the boot socket as handle sees it: a real loopback UDP
// socket whose writes are kept (copied, with their destination) instead of
// sent, since a reply's destination is fixed by the protocol (broadcast,
// port 68) and a test cannot listen there.
type sentConn struct {
	net.PacketConn
	mu   sync.Mutex
	sent map[[4]byte][]byte // by xid
}

func (c *sentConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	m, err := dhcpv4.FromBytes(b)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent[m.TransactionID] = append([]byte(nil), b...)
	return len(b), nil
}

// TestHandleConcurrentReplies: replies written by concurrent handlers (from
// the reply pool, into pooled buffers) each answer their own request: its
// xid, MAC and a distinct address, with the range's options.
func TestHandleConcurrentReplies(t *testing.T) {
	f := newFixture(t, ModeFull)
	sock, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	conn := &sentConn{PacketConn: sock, sent: map[[4]byte][]byte{}}
	const n = 64 // the local range has 100 addresses
	kinds := []func(*dhcpv4.DHCPv4){plain, biosPXE, ipxeClient, efiPXE}
	round := func(mk func(i int) *dhcpv4.DHCPv4) map[int]*dhcpv4.DHCPv4 {
		reqs := map[int]*dhcpv4.DHCPv4{}
		for i := range n {
			reqs[i] = mk(i)
		}
		var wg sync.WaitGroup
		for _, m := range reqs {
			p, err := dhcpv4.FromBytes(m.ToBytes())
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				f.s.handle(job{conn: conn, up: &net.UDPAddr{IP: net.IPv4zero, Port: 68}, m: p, port: dhcpv4.ServerPort})
			})
		}
		wg.Wait()
		out := map[int]*dhcpv4.DHCPv4{}
		conn.mu.Lock()
		defer conn.mu.Unlock()
		for i, m := range reqs {
			b, ok := conn.sent[m.TransactionID]
			if !ok {
				t.Fatalf("client %d: no reply", i)
			}
			r, err := dhcpv4.FromBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			if r.ClientHWAddr.String() != m.ClientHWAddr.String() || r.ServerIdentifier().String() != serverIP.String() ||
				r.Router()[0].String() != "10.0.0.254" || r.SubnetMask().String() != "ffffff00" {
				t.Fatalf("client %d: reply %s", i, r.Summary())
			}
			out[i] = r
		}
		return out
	}
	offers := round(func(i int) *dhcpv4.DHCPv4 { return discover(t, mac(0xa00+i), kinds[i%len(kinds)]) })
	acks := round(func(i int) *dhcpv4.DHCPv4 {
		req, err := dhcpv4.NewRequestFromOffer(offers[i])
		if err != nil {
			t.Fatal(err)
		}
		kinds[i%len(kinds)](req)
		return req
	})
	seen := map[string]int{}
	for i := range n {
		o, a := offers[i], acks[i]
		if o.MessageType() != dhcpv4.MessageTypeOffer || a.MessageType() != dhcpv4.MessageTypeAck || !a.YourIPAddr.Equal(o.YourIPAddr) {
			t.Fatalf("client %d: %s then %s", i, o.Summary(), a.Summary())
		}
		if j, dup := seen[a.YourIPAddr.String()]; dup {
			t.Fatalf("clients %d and %d both ACKed %s", j, i, a.YourIPAddr)
		}
		seen[a.YourIPAddr.String()] = i
	}
}

// TestPXEPortAnswersTheSender: a boot-server request read from the running
// server's port-4011 socket is answered to the address and port it came
// from (serve keeps the source only for that port).
func TestPXEPortAnswersTheSender(t *testing.T) {
	f := newFixture(t, ModeFull)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	cl, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac(0xb00)),
		dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)))
	if err != nil {
		t.Fatal(err)
	}
	biosPXE(req)
	if _, err := cl.WriteTo(req.ToBytes(), f.s.pxe.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, _, err := cl.ReadFrom(buf)
	if err != nil {
		t.Fatalf("no answer from port 4011: %v", err)
	}
	ack, err := dhcpv4.FromBytes(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	if ack.MessageType() != dhcpv4.MessageTypeAck || ack.TransactionID != req.TransactionID || ack.BootFileName != "undionly.kpxe" {
		t.Errorf("port 4011 answer: %s", ack.Summary())
	}
}
