package e2e

import (
	"encoding/binary"
	"os/exec"

	"crypto/rand"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/corralhq/corral/testsupport/require"
)

// udpIn opens a UDP socket on addr inside namespace ns.
func udpIn(t *testing.T, ns, addr string) *net.UDPConn { return udpNetIn(t, ns, "udp4", addr) }

// udpNetIn opens a socket of network (udp4, udp6) on addr inside ns.
func udpNetIn(t *testing.T, ns, network, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	var err error
	inNS(t, ns, func() {
		var pc net.PacketConn
		pc, err = net.ListenPacket(network, addr)
		if err == nil {
			c = pc.(*net.UDPConn)
		}
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange sends m to dst and returns the first reply with m's xid, or nil
// after timeout.
func exchange(t *testing.T, c *net.UDPConn, m *dhcpv4.DHCPv4, dst *net.UDPAddr, timeout time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()
	if _, err := c.WriteTo(m.ToBytes(), dst); err != nil {
		t.Fatalf("send to %s: %v", dst, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(deadline)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil
		}
		r, err := dhcpv4.FromBytes(buf[:n])
		if err == nil && r.TransactionID == m.TransactionID && r.OpCode == dhcpv4.OpcodeBootReply {
			return r
		}
	}
}

func pxeOpts(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))
}

// TestRelayAndBadInput runs corrald in full mode with a relayed range and
// checks, over real sockets in test-made namespaces: a relay agent (giaddr)
// gets its answer sent to it from the relay's range; requests arriving on
// another interface are never answered; garbage, truncated packets and a
// DISCOVER flood from random MACs leave corrald serving; the leases survive
// a restart.
func TestRelayAndBadInput(t *testing.T) {
	need(t)
	l := newLab(t)
	relayNS, _ := l.peer("r", l.subnet+".3/24")
	// The relay's client-side segment: 10.9.0.1 on a bridge of its own.
	l.ipn(relayNS, "link", "add", "seg", "type", "bridge")
	l.ipn(relayNS, "addr", "add", "10.9.0.1/24", "dev", "seg")
	l.ipn(relayNS, "link", "set", "seg", "up")
	l.ipn(l.ns, "route", "add", "10.9.0.0/24", "via", l.subnet+".3")
	// A segment corrald is attached to but must not serve.
	otherNS, otherIf := "cbt"+l.id+"o", "o"+l.id[:4]
	l.ip("netns", "add", otherNS)
	l.extra = append(l.extra, otherNS)
	l.ipn(l.ns, "link", "add", otherIf, "type", "veth", "peer", "name", "eo", "netns", otherNS)
	l.ipn(l.ns, "addr", "add", "10.88.0.1/24", "dev", otherIf)
	l.ipn(l.ns, "link", "set", otherIf, "up")
	l.ipn(otherNS, "addr", "add", "10.88.0.2/24", "dev", "eo")
	l.ipn(otherNS, "link", "set", "eo", "up")
	l.ipn(otherNS, "route", "add", "default", "dev", "eo")
	clientNS, clientIf := l.peer("c", "")
	l.ipn(clientNS, "route", "add", "default", "dev", clientIf)

	args := []string{"--dhcp-mode", "full", "--dhcp-range", l.subnet + ".100-" + l.subnet + ".150", "--tftp-listen", "off",
		"--dhcp-relay-range", "10.9.0.0/24=10.9.0.100-10.9.0.120@10.9.0.1"}
	c := l.corrald(args...)
	server := &net.UDPAddr{IP: net.ParseIP(l.subnet + ".1"), Port: 67}

	// Relay: DISCOVER and REQUEST with giaddr, from the relay's port 67.
	relay := udpIn(t, relayNS, "10.9.0.1:67")
	relayMAC := net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x00, 0x01}
	d, _ := dhcpv4.NewDiscovery(relayMAC, dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)), func(d *dhcpv4.DHCPv4) { d.HopCount = 1 })
	pxeOpts(d)
	offer := exchange(t, relay, d, server, 5*time.Second)
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("relay: no OFFER (got %v)", offer)
	}
	if !hostIn(offer.YourIPAddr, "10.9.0.100", "10.9.0.120") || len(offer.Router()) == 0 || !offer.Router()[0].Equal(net.IPv4(10, 9, 0, 1)) {
		t.Fatalf("relay OFFER from the wrong range: yiaddr %s router %v", offer.YourIPAddr, offer.Router())
	}
	if offer.BootFileName != "undionly.kpxe" || !offer.ServerIPAddr.Equal(server.IP) {
		t.Errorf("relay OFFER boot: file %q siaddr %s", offer.BootFileName, offer.ServerIPAddr)
	}
	req, _ := dhcpv4.NewRequestFromOffer(offer)
	req.GatewayIPAddr = net.IPv4(10, 9, 0, 1)
	pxeOpts(req)
	ack := exchange(t, relay, req, server, 5*time.Second)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("relay: no ACK for %s (got %v)", offer.YourIPAddr, ack)
	}
	c.waitTimeline(relayMAC.String(), []want{
		{"dhcp", "discover", map[string]string{"relay": "10.9.0.1", "range": `10\.9\.0\.100-10\.9\.0\.120 .*`}},
		{"dhcp", "offer", map[string]string{"ip": `10\.9\.0\.1[0-2]\d`}},
		{"dhcp", "ack", map[string]string{"relay": "10.9.0.1"}},
	}, 10*time.Second)

	// Another interface: broadcast DISCOVER from the other segment.
	other := udpIn(t, otherNS, "0.0.0.0:68")
	inNS(t, otherNS, func() {
		rc, _ := other.SyscallConn()
		rc.Control(func(fd uintptr) { setBroadcast(fd) })
	})
	otherMAC := net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x00, 0x02}
	d, _ = dhcpv4.NewDiscovery(otherMAC)
	pxeOpts(d)
	if r := exchange(t, other, d, &net.UDPAddr{IP: net.IPv4bcast, Port: 67}, 2*time.Second); r != nil {
		t.Fatalf("answered a request from another interface: %v", r)
	}

	// Garbage, truncated packets and a flood of DISCOVERs from random MACs
	// on the boot segment.
	cl := udpIn(t, clientNS, "0.0.0.0:68")
	inNS(t, clientNS, func() {
		rc, _ := cl.SyscallConn()
		rc.Control(func(fd uintptr) { setBroadcast(fd) })
	})
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	good, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x00, 0x03})
	raw := good.ToBytes()
	for i := 0; i < 200; i++ {
		junk := make([]byte, i*7%600)
		rand.Read(junk)
		cl.WriteTo(junk, bcast)
		cl.WriteTo(raw[:i%len(raw)], bcast)
	}
	const flood = 3000
	for i := 0; i < flood; i++ {
		hw := make(net.HardwareAddr, 6)
		rand.Read(hw)
		hw[0] = 0x02
		m, _ := dhcpv4.NewDiscovery(hw)
		cl.WriteTo(m.ToBytes(), bcast)
	}
	// Still serving: a DORA from a fixed MAC completes.
	fixed := net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x00, 0x04}
	var got *dhcpv4.DHCPv4
	for try := 0; try < 10 && got == nil; try++ {
		d, _ = dhcpv4.NewDiscovery(fixed)
		pxeOpts(d)
		got = exchange(t, cl, d, bcast, 3*time.Second)
	}
	if got == nil {
		t.Fatal("corrald stopped answering after garbage and a DISCOVER flood")
	}
	req, _ = dhcpv4.NewRequestFromOffer(got)
	ack = exchange(t, cl, req, bcast, 5*time.Second)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("no ACK after the flood: %v", ack)
	}
	if es := c.timeline(otherMAC.String()); len(es) != 0 {
		t.Errorf("the other interface's client is on the timeline:\n%s", render(es))
	}
	logText, _ := os.ReadFile(c.log)
	if !strings.Contains(string(logText), "ignoring malformed DHCP packet") {
		t.Error("no log line for malformed packets")
	}

	// Restart on the same store: it opens, and the relay client's lease is
	// still its own (sticky).
	c.stop(t)
	l.corrald(args...) // stopped by the lab's cleanup
	d, _ = dhcpv4.NewDiscovery(relayMAC, dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)), func(d *dhcpv4.DHCPv4) { d.HopCount = 1 })
	again := exchange(t, relay, d, server, 5*time.Second)
	if again == nil || !again.YourIPAddr.Equal(ack.YourIPAddr) && !again.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("after restart the relay client got %v, want %s", again, offer.YourIPAddr)
	}

	// RA: a router solicitation from the boot segment gets a lifetime-0
	// advertisement.
	checkRA(t, clientNS, clientIf)
}

func checkRA(t *testing.T, ns, ifname string) {
	t.Helper()
	exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf."+ifname+".accept_ra=0").Run()
	var conn *icmp.PacketConn
	var err error
	inNS(t, ns, func() { conn, err = icmp.ListenPacket("ip6:ipv6-icmp", "::") })
	if err != nil {
		require.Missing(t, "no IPv6 in the namespace: %v", err)
	}
	defer conn.Close()
	p := conn.IPv6PacketConn()
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterAdvertisement)
	p.SetICMPFilter(&f)
	p.SetMulticastHopLimit(255)
	var ifi *net.Interface
	inNS(t, ns, func() { ifi, err = net.InterfaceByName(ifname) })
	if err != nil {
		t.Fatal(err)
	}
	p.SetMulticastInterface(ifi)
	body := append(make([]byte, 4), 1, 1)
	body = append(body, ifi.HardwareAddr...)
	rs, _ := (&icmp.Message{Type: ipv6.ICMPTypeRouterSolicitation, Body: &icmp.RawBody{Data: body}}).Marshal(nil)
	buf := make([]byte, 1500)
	deadline := time.Now().Add(20 * time.Second) // link-local addresses finish DAD first
	for time.Now().Before(deadline) {
		p.WriteTo(rs, &ipv6.ControlMessage{HopLimit: 255, IfIndex: ifi.Index}, &net.IPAddr{IP: net.ParseIP("ff02::2"), Zone: ifname})
		p.SetReadDeadline(time.Now().Add(time.Second))
		n, _, src, err := p.ReadFrom(buf)
		if err != nil {
			continue
		}
		m, err := icmp.ParseMessage(58, buf[:n])
		if err != nil || m.Type != ipv6.ICMPTypeRouterAdvertisement {
			continue
		}
		d := m.Body.(*icmp.RawBody).Data
		if lifetime := binary.BigEndian.Uint16(d[2:4]); lifetime != 0 {
			t.Fatalf("RA from %v with router lifetime %d", src, lifetime)
		}
		return
	}
	t.Fatal("no router advertisement within 20s")
}
