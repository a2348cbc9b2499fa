package main

// Attack tests of full-mode DHCP's lease holders and its silence while
// the store is gone (docs/security.md, "DHCP under spoofing (RFC 2131)")
// against the built corrald in a network namespace, with raw DHCP from a
// client namespace: MACs cycling through a small range leave no more
// holder records in the store than the range has addresses; a client
// sending a victim's MAC while the victim's lease is live gets no address
// but the victim's and a NAK for any other, the victim's lease unchanged;
// a DISCOVER whose machine cannot be recorded is not answered. The bolt
// store is read once corrald has stopped.

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/require"
)

// afterCorrald runs fn when the test ends, after the corrald that
// startFullCorrald starts in t (called after afterCorrald) has stopped and
// before its data directory is removed: the first t.TempDir registers the
// directories' removal, which cleanups run last.
func afterCorrald(t *testing.T, fn func()) {
	t.TempDir()
	t.Cleanup(fn)
}

// storedLeases opens the bolt store of a stopped corrald's data directory
// and returns its leases by address and its lease holder records.
func storedLeases(t *testing.T, dataDir string) (map[string]*bootv1.Lease, []store.KV) {
	t.Helper()
	ctx := context.Background()
	st, err := bolt.Open(filepath.Join(dataDir, "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatalf("open the stopped corrald's store: %v", err)
	}
	defer st.Close()
	ls, err := record.List(ctx, st, store.LeasesPrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]*bootv1.Lease{}
	for _, l := range ls {
		byIP[l.GetIp()] = l
	}
	hs, err := st.List(ctx, store.LeaseHoldersPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return byIP, hs
}

// release sends a RELEASE of ip for mac (broadcast: the client namespace
// reaches the server on its segment either way).
func release(t *testing.T, c *net.UDPConn, mac, ip, server string) {
	t.Helper()
	hw, _ := net.ParseMAC(mac)
	m, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(hw),
		dhcpv4.WithClientIP(net.ParseIP(ip)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP(server))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
		t.Fatalf("send RELEASE: %v", err)
	}
}

// TestAttackDHCPMACCycling: clients on the boot LAN cycle MACs through a
// four-address range: three times the range in MACs that RELEASE their
// leases, then three times the range in MACs that let theirs run out.
// Every MAC gets an address, and the store of the stopped corrald holds
// at most one holder record per address of the range, each naming an
// address whose lease names its MAC. Before holders were deleted with the
// binding they belong to (2026-11-29), it held one for every MAC that ever
// bound.
func TestAttackDHCPMACCycling(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for DHCP in full mode")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const (
		subnet = "10.77.7"
		pool   = 4
		ttl    = 3 * time.Second
	)
	var data string
	afterCorrald(t, func() {
		if data == "" {
			return
		}
		leases, holders := storedLeases(t, data)
		t.Logf("%d MACs through a range of %d: %d lease records, %d holder records stored (before: one holder per MAC, %d)",
			6*pool, pool, len(leases), len(holders), 6*pool)
		if len(holders) > pool {
			t.Errorf("%d holder records stored, more than the range's %d addresses", len(holders), pool)
		}
		for _, h := range holders {
			mac := h.Key[strings.LastIndex(h.Key, "/")+1:]
			if l := leases[string(h.Value)]; l.GetMac() != mac {
				t.Errorf("holder %s names %s, whose lease is %v", h.Key, h.Value, l)
			}
		}
	})
	srvNS, cliNS, br, _ := netnsPair(t, "cmc", subnet, subnet+".250")
	f := startFullCorrald(t, srvNS, br, subnet, "--dhcp-range", fmt.Sprintf("%s.100-%s.%d", subnet, subnet, 100+pool-1),
		"--dhcp-lease-time", ttl.String())
	data = f.data
	dhcp := dhcpClient(t, cliNS)
	n := 0
	// MACs that give their lease back at once.
	for i := range 3 * pool {
		mac := fmt.Sprintf("52:54:00:cd:00:%02x", i)
		ip := dora(t, dhcp, mac)
		release(t, dhcp, mac, ip, subnet+".1")
		n++
	}
	// MACs whose leases run out: each round takes the range again.
	for round := range 3 {
		if round > 0 {
			time.Sleep(ttl + time.Second)
		}
		for range pool {
			mac := fmt.Sprintf("52:54:00:cc:%02x:%02x", round, n)
			if ip := dora(t, dhcp, mac); !strings.HasPrefix(ip, subnet+".10") {
				t.Fatalf("%s got %s, outside the range", mac, ip)
			}
			n++
		}
	}
	if n != 6*pool {
		t.Fatalf("%d MACs bound, want %d", n, 6*pool)
	}
}

// TestAttackDHCPSpoofedMAC: a victim holds a live lease; a client sending
// the victim's MAC (DISCOVER, REQUEST in each RFC 2131 state for another
// free address, for another client's address) is offered only the
// victim's address and NAKed for any other, and the store of the stopped
// corrald holds the victim's lease as its ACK wrote it, the victim's one
// holder naming it, and no lease of the victim's MAC elsewhere.
func TestAttackDHCPSpoofedMAC(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for DHCP in full mode")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const (
		subnet        = "10.77.8"
		victim, other = "52:54:00:dd:00:01", "52:54:00:dd:00:02"
		free          = subnet + ".140"
	)
	var (
		data           string
		leaseV, leaseO string
		ackedAt        time.Time
	)
	afterCorrald(t, func() {
		if data == "" || leaseV == "" {
			return
		}
		leases, holders := storedLeases(t, data)
		v := leases[leaseV]
		if v.GetMac() != victim || v.GetState() != bootv1.Lease_STATE_ACTIVE || v.GetUpdatedUnix() > ackedAt.Unix() {
			t.Errorf("the victim's lease on %s after the spoofing: %v (ACKed at %d)", leaseV, v, ackedAt.Unix())
		}
		if o := leases[leaseO]; o.GetMac() != other {
			t.Errorf("the other client's lease on %s: %v", leaseO, o)
		}
		for ip, l := range leases {
			if l.GetMac() == victim && ip != leaseV {
				t.Errorf("the victim's MAC holds a lease on %s too: %v", ip, l)
			}
		}
		var victims []string
		for _, h := range holders {
			if strings.HasSuffix(h.Key, "/"+victim) {
				victims = append(victims, string(h.Value))
			}
		}
		if len(victims) != 1 || victims[0] != leaseV {
			t.Errorf("the victim's holder records name %v, want [%s]", victims, leaseV)
		}
		t.Logf("%d leases, %d holder records stored; the victim's lease on %s updated at %d (its ACK)", len(leases), len(holders), leaseV, v.GetUpdatedUnix())
	})
	srvNS, cliNS, br, _ := netnsPair(t, "csp", subnet, subnet+".250")
	f := startFullCorrald(t, srvNS, br, subnet)
	data = f.data
	dhcp := dhcpClient(t, cliNS)
	leaseV = dora(t, dhcp, victim)
	ackedAt = time.Now()
	leaseO = dora(t, dhcp, other)
	time.Sleep(1100 * time.Millisecond) // a rewrite of the victim's lease would show in its updated time

	hw, _ := net.ParseMAC(victim)
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	server := net.ParseIP(subnet + ".1")
	d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true), pxeClient, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(free))))
	if err != nil {
		t.Fatal(err)
	}
	if offer := dhcpExchange(t, dhcp, d, bcast, dhcpv4.MessageTypeOffer); offer == nil || offer.YourIPAddr.String() != leaseV {
		t.Errorf("DISCOVER with the victim's MAC asking for %s: offered %v, want the victim's %s", free, offer, leaseV)
	}
	for name, mods := range map[string][]dhcpv4.Modifier{
		"selecting a free address": {dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(free)))},
		"selecting the other client's address": {dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(leaseO)))},
		"init-reboot on a free address": {dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(free)))},
		"init-reboot on the other's":    {dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(leaseO)))},
		"renewing a free address":       {dhcpv4.WithClientIP(net.ParseIP(free))},
		"renewing the other's address":  {dhcpv4.WithClientIP(net.ParseIP(leaseO))},
	} {
		m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(hw),
			dhcpv4.WithBroadcast(true), pxeClient}, mods...)...)
		if err != nil {
			t.Fatal(err)
		}
		if rep := dhcpReply(t, dhcp, m, bcast); rep == nil || rep.MessageType() != dhcpv4.MessageTypeNak {
			t.Errorf("%s with the victim's MAC: %v, want a NAK", name, rep)
		}
	}
}

// dhcpReply sends m and returns the first reply with m's transaction id,
// whatever its type, or nil after 2 s.
func dhcpReply(t *testing.T, c *net.UDPConn, m *dhcpv4.DHCPv4, dst *net.UDPAddr) *dhcpv4.DHCPv4 {
	t.Helper()
	if _, err := c.WriteTo(m.ToBytes(), dst); err != nil {
		t.Fatalf("send DHCP: %v", err)
	}
	buf := make([]byte, 1500)
	for deadline := time.Now().Add(2 * time.Second); ; {
		c.SetReadDeadline(deadline)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil
		}
		if r, err := dhcpv4.FromBytes(buf[:n]); err == nil && r.TransactionID == m.TransactionID && r.OpCode == dhcpv4.OpcodeBootReply {
			return r
		}
	}
}

// TestAttackDHCPStoreGone: corrald in full DHCP mode on a one-member etcd
// (reached from its namespace through a TCP relay). While the member is
// down the store answers nothing (every request runs to its deadline, the
// same path as store.ErrBusy from etcd's admission): a DISCOVER from a
// machine never seen gets no OFFER, since no record of it can be written,
// and corrald logs it and keeps running; once the member is back the same
// machine is offered an address. The saturation refusal itself
// (store.ErrBusy) needs a store under a storm to provoke; boot/dhcp's
// busy_test.go covers it with a refusing store.
func TestAttackDHCPStoreGone(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for DHCP in full mode")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const (
		subnet   = "10.77.9"
		known    = "52:54:00:ee:00:01"
		stranger = "52:54:00:ee:00:02"
	)
	c := etcdtest.New(t, 1)
	srvNS, cliNS, br, _ := netnsPair(t, "csg", subnet, subnet+".250")
	endpoint := strings.TrimPrefix(c.Endpoints()[0], "http://")
	tcpRelay(t, srvNS, endpoint, endpoint)
	f := startFullCorrald(t, srvNS, br, subnet, "--store", "etcd", "--etcd-endpoints", "http://"+endpoint, "--etcd-prefix", "/dhcpbusy")
	dhcp := dhcpClient(t, cliNS)
	dora(t, dhcp, known)

	c.Kill(0)
	hw, _ := net.ParseMAC(stranger)
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	for range 5 {
		d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true), pxeClient)
		if err != nil {
			t.Fatal(err)
		}
		if rep := dhcpReply(t, dhcp, d, bcast); rep != nil {
			t.Fatalf("DISCOVER with the store gone: %s for %s, want silence", rep.MessageType(), rep.YourIPAddr)
		}
	}
	if !strings.Contains(f.logs.String(), "store busy: DISCOVER not answered") {
		t.Errorf("no log line for the unanswered DISCOVERs")
	}

	if err := c.StartMember(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var offer *dhcpv4.DHCPv4
	for deadline := time.Now().Add(60 * time.Second); offer == nil && time.Now().Before(deadline); {
		d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true), pxeClient)
		if err != nil {
			t.Fatal(err)
		}
		offer = dhcpExchange(t, dhcp, d, bcast, dhcpv4.MessageTypeOffer)
	}
	if offer == nil {
		t.Fatalf("no OFFER for %s once the store is back", stranger)
	}
	t.Logf("store gone: 5 DISCOVERs unanswered; store back: OFFER %s", offer.YourIPAddr)
}

// tcpRelay forwards TCP connections made to listen (in namespace ns) to
// the address to (in the test's own namespace) until the test ends.
func tcpRelay(t *testing.T, ns, listen, to string) {
	t.Helper()
	var l net.Listener
	inNetns(t, ns, func() {
		var err error
		if l, err = net.Listen("tcp4", listen); err != nil {
			t.Fatalf("relay listen %s in %s: %v", listen, ns, err)
		}
	})
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp4", to, 5*time.Second)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, up)
			mu.Unlock()
			wg.Go(func() { io.Copy(up, in); up.Close() })
			wg.Go(func() { io.Copy(in, up); in.Close() })
		}
	})
}
