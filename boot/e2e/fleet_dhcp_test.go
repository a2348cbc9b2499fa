package e2e

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/leaseholds"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// DHCP on a segment two appliances share (docs/fleet.md).

// TestFleetDHCPSharedSegment runs two built corrald in full mode on one
// bridge with the same 40-address range, their leases in a real
// three-member etcd cluster, and many raw DHCP clients on the segment
// that broadcast to both at once (each takes the first OFFER and
// REQUESTs it from that server, restarting at DISCOVER on a NAK):
//   - 200 clients over the 40 addresses, each releasing its lease soon
//     after its ACK (the range is recycled many times over, through both);
//   - then 35 new clients that keep theirs (every address they get is a
//     released lease of a client of the first wave: the reclaim path);
//   - then those 35 DISCOVER again, and each is offered its own address
//     by both appliances (whichever answers first).
//
// No address is ever ACKed to a second client while the first holds it
// (as the clients saw the ACKs), both appliances answer, and afterwards
// the live leases in etcd are exactly what the clients hold.
func TestFleetDHCPSharedSegment(t *testing.T) {
	need(t, "etcd")
	cluster := etcdtest.New(t, 3)
	l := newLab(t)
	bNS, bIf := l.peer("b", l.subnet+".2/24")
	clientNS, clientIf := l.peer("c", l.subnet+".3/24")
	l.ipn(clientNS, "route", "add", "default", "dev", clientIf)
	forwardEtcd(t, l.ns, cluster)
	forwardEtcd(t, bNS, cluster)

	const prefix = "/fleetdhcp"
	first, last := l.subnet+".100", l.subnet+".139"
	args := []string{"--store", "etcd", "--etcd-endpoints", cluster.EndpointsFlag(), "--etcd-prefix", prefix,
		"--dhcp-mode", "full", "--dhcp-range", first + "-" + last, "--tftp-listen", "off", "--no-ra", "--leader-lease-ttl", "3s"}
	dirA := filepath.Join(l.dir, "a")
	l.appliance(l.ns, l.bridge, "a", dirA, dirA, args...)
	l.appliance(bNS, bIf, "b", filepath.Join(l.dir, "b"), dirA, append(args, "--cluster-key", filepath.Join(dirA, "cluster.key"))...)

	seg := newSegment(t, clientNS)
	servers := []string{l.subnet + ".1", l.subnet + ".2"}
	seg.waitServers(servers, 60*time.Second)
	held := leaseholds.New()

	// The two split the DISCOVERs (docs/architecture.md, "DHCP load
	// balancing in a fleet"): a client's first DISCOVER (secs 0) gets one
	// OFFER, from either; the same client having waited 3 s gets both.
	// Each appliance learns the other's DHCP segment from its runner
	// record within a second or two of both running.
	split := func() (one int, by map[string]int) {
		by = map[string]int{}
		for i := range 24 {
			d, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0x00, 0xf3, 0x00, byte(i)})
			rs := s4(seg.collect(d, 2, 1500*time.Millisecond))
			if len(rs) == 1 {
				one++
				by[rs[0]]++
			}
		}
		return one, by
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		one, by := split()
		if one == 24 && len(by) == 2 {
			t.Logf("24 first DISCOVERs, each answered once: %v", by)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first DISCOVERs: %d of 24 answered once (by %v): the appliances do not split the segment", one, by)
		}
		time.Sleep(time.Second)
	}
	late, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x52, 0x54, 0x00, 0xf3, 0x00, 0x01})
	late.NumSeconds = 3
	if rs := s4(seg.collect(late, 2, 3*time.Second)); len(rs) != 2 {
		t.Fatalf("a DISCOVER with secs 3 answered by %v, want both", rs)
	}

	wave := func(name string, clients, parallel int, release bool) {
		t.Helper()
		start := time.Now()
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		var mu sync.Mutex
		naks, failed := 0, 0
		for i := range clients {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				hw := net.HardwareAddr{0x52, 0x54, 0x00, 0xf1, byte(i >> 8), byte(i)}
				if !release {
					hw[3] = 0xf2
				}
				ip, server, n := seg.dora(hw)
				mu.Lock()
				naks += n
				if ip == nil {
					failed++
				}
				mu.Unlock()
				if ip == nil {
					return
				}
				if other := held.Ack(ip, hw); other != "" {
					t.Errorf("DUPLICATE: %s ACKed to %s by %s while %s holds it", ip, hw, server, other)
				}
				if release {
					held.Release(ip, hw)
					seg.release(hw, ip, server)
				}
			}()
		}
		wg.Wait()
		t.Logf("%s: %d clients in %s, %d NAKs, %d without a lease after 20 tries", name, clients, time.Since(start).Round(time.Millisecond), naks, failed)
		if failed > 0 {
			t.Errorf("%s: %d clients got no lease", name, failed)
		}
	}
	wave("200 clients over 40 addresses, releasing", 200, 25, true)
	wave("35 new clients on the 40 addresses, holding", 35, 35, false)

	// The holders DISCOVER again (a reboot that forgot its lease): each
	// gets its own address back from whichever appliance answers first,
	// so the one that did not bind it knows it too (through its watch).
	var wg sync.WaitGroup
	for ip, mac := range held.Snapshot() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hw, _ := net.ParseMAC(mac)
			got, server, _ := seg.dora(hw)
			if got.String() != ip {
				t.Errorf("%s holds %s; DISCOVERing again it got %v from %v", mac, ip, got, server)
			}
		}()
	}
	wg.Wait()

	offers, acks := seg.counts()
	t.Logf("OFFERs by server %v, ACKs by server %v", offers, acks)
	for _, s := range servers {
		if offers[s] == 0 {
			t.Errorf("appliance %s made no OFFER: the clients were not served by both", s)
		}
	}

	// The store: the live leases are exactly the ones the clients hold.
	st, err := etcd.Open(context.Background(), etcd.Options{Endpoints: cluster.Endpoints(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ls, err := record.List(context.Background(), st, dhcp.LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]string{}
	now := time.Now().Unix()
	for _, le := range ls {
		if le.GetState() == bootv1.Lease_STATE_ACTIVE && now < le.GetExpiresUnix() {
			live[le.GetIp()] = le.GetMac()
		}
	}
	if diff := cmp.Diff(held.Snapshot(), live); diff != "" {
		t.Errorf("live leases in etcd differ from what the clients hold (-clients +etcd):\n%s", diff)
	}
	if len(ls) > 40 {
		t.Errorf("%d lease records for a 40-address range", len(ls))
	}
}

// TestFleetDHCPProxyMode: proxy mode hands out no addresses, so two
// appliances in proxy mode on one segment need no coordination (each
// here on its own bbolt file): both answer a PXE client's DISCOVER with
// boot options and no address.
func TestFleetDHCPProxyMode(t *testing.T) {
	need(t)
	l := newLab(t)
	bNS, bIf := l.peer("b", l.subnet+".2/24")
	clientNS, clientIf := l.peer("c", l.subnet+".3/24")
	l.ipn(clientNS, "route", "add", "default", "dev", clientIf)
	args := []string{"--dhcp-mode", "proxy", "--tftp-listen", "off", "--no-ra"}
	dirA, dirB := filepath.Join(l.dir, "a"), filepath.Join(l.dir, "b")
	l.appliance(l.ns, l.bridge, "a", dirA, dirA, args...)
	l.appliance(bNS, bIf, "b", dirB, dirB, args...)
	seg := newSegment(t, clientNS)
	hw := net.HardwareAddr{0x52, 0x54, 0x00, 0xf3, 0x00, 0x01}
	d, _ := dhcpv4.NewDiscovery(hw)
	pxeOpts(d)
	got := seg.collect(d, 2, 5*time.Second)
	servers := map[string]bool{}
	for _, o := range got {
		if o.MessageType() != dhcpv4.MessageTypeOffer || !o.YourIPAddr.IsUnspecified() || o.BootFileName != "undionly.kpxe" {
			t.Errorf("proxy answer from %s: %s yiaddr %s file %q", o.ServerIdentifier(), o.MessageType(), o.YourIPAddr, o.BootFileName)
		}
		servers[o.ServerIdentifier().String()] = true
	}
	if !servers[l.subnet+".1"] || !servers[l.subnet+".2"] {
		t.Errorf("proxy OFFERs from %v, want both appliances", servers)
	}
}

// fleetAppliance is a corrald the test started in a namespace of the lab.
type fleetAppliance struct {
	*proc
	ns, dataDir, adminConf string
}

// appliance starts corrald in namespace ns, booting on iface, with its
// data in dataDir, and waits until its API answers with adminDir's
// admin.conf (the fleet's first appliance writes it; the others share its
// CA and tokens through the store).
func (l *lab) appliance(ns, iface, name, dataDir, adminDir string, args ...string) *fleetAppliance {
	l.t.Helper()
	base := []string{"netns", "exec", ns, filepath.Join(binDir, "corrald"), "serve", "--data-dir", dataDir,
		"--api-listen", ":20180", "--boot-interface", iface, "--log-level", "debug", "--boot-initrd", testInitrd, "--allow-test-images",
		"--appliance-name", name}
	a := &fleetAppliance{proc: l.start("ip", "corrald-"+name+".log", append(base, args...)...), ns: ns, dataDir: dataDir,
		adminConf: filepath.Join(adminDir, "admin.conf")}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := nsExec(ns, filepath.Join(binDir, "corral"), "--config", a.adminConf, "machine", "timeline", "00:00:00:00:00:01")
		if err == nil {
			return a
		}
		select {
		case <-a.done:
			b, _ := os.ReadFile(a.log)
			l.t.Fatalf("corrald %s exited:\n%s", name, tail(b, 4096))
		default:
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("corrald %s did not come up in 60s: %v\n%s", name, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// forwardEtcd makes the etcd members reachable from namespace ns at the
// loopback addresses they have in the test's own namespace (members
// advertise those, and the client syncs its endpoints to them), by
// copying bytes between a listener in ns and the member.
func forwardEtcd(t *testing.T, ns string, c *etcdtest.Cluster) {
	t.Helper()
	var mu sync.Mutex
	var closers []io.Closer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range closers {
			c.Close()
		}
	})
	track := func(c io.Closer) { mu.Lock(); closers = append(closers, c); mu.Unlock() }
	for _, u := range c.Endpoints() {
		addr := strings.TrimPrefix(u, "http://")
		var ln net.Listener
		var err error
		inNS(t, ns, func() { ln, err = net.Listen("tcp", addr) })
		if err != nil {
			t.Fatalf("forward etcd %s into %s: %v", addr, ns, err)
		}
		track(ln)
		go func() {
			for {
				in, err := ln.Accept()
				if err != nil {
					return
				}
				out, err := net.Dial("tcp", addr) // from the test's namespace
				if err != nil {
					in.Close()
					continue
				}
				track(in)
				track(out)
				go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				go func() { io.Copy(in, out); in.(*net.TCPConn).CloseWrite() }()
			}
		}()
	}
}

// segment is many DHCP clients on one socket in a namespace on the shared
// segment: DISCOVER and REQUEST are broadcast (every appliance sees them),
// replies are told apart by transaction id.
type segment struct {
	t    *testing.T
	conn *net.UDPConn
	mu   sync.Mutex
	wait map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4
	// offers and acks count the answers by server identifier.
	offers, acks map[string]int
}

func newSegment(t *testing.T, ns string) *segment {
	t.Helper()
	c := udpIn(t, ns, "0.0.0.0:68")
	inNS(t, ns, func() {
		rc, _ := c.SyscallConn()
		rc.Control(func(fd uintptr) { setBroadcast(fd) })
	})
	c.SetReadBuffer(4 << 20)
	s := &segment{t: t, conn: c, wait: map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4{}, offers: map[string]int{}, acks: map[string]int{}}
	go s.read()
	return s
}

func (s *segment) read() {
	buf := make([]byte, 1500)
	for {
		n, _, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		m, err := dhcpv4.FromBytes(buf[:n])
		if err != nil || m.OpCode != dhcpv4.OpcodeBootReply {
			continue
		}
		s.mu.Lock()
		switch m.MessageType() {
		case dhcpv4.MessageTypeOffer:
			s.offers[m.ServerIdentifier().String()]++
		case dhcpv4.MessageTypeAck:
			s.acks[m.ServerIdentifier().String()]++
		default:
			// Only OFFERs and ACKs are counted.
		}
		ch := s.wait[m.TransactionID]
		s.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default:
			}
		}
	}
}

func (s *segment) counts() (offers, acks map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps(s.offers), maps(s.acks)
}

func maps(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *segment) register() (dhcpv4.TransactionID, chan *dhcpv4.DHCPv4) {
	var xid dhcpv4.TransactionID
	rand.Read(xid[:])
	ch := make(chan *dhcpv4.DHCPv4, 16)
	s.mu.Lock()
	s.wait[xid] = ch
	s.mu.Unlock()
	return xid, ch
}

func (s *segment) unregister(xid dhcpv4.TransactionID) {
	s.mu.Lock()
	delete(s.wait, xid)
	s.mu.Unlock()
}

var bcast67 = &net.UDPAddr{IP: net.IPv4bcast, Port: 67}

func (s *segment) send(m *dhcpv4.DHCPv4, dst *net.UDPAddr) {
	if _, err := s.conn.WriteTo(m.ToBytes(), dst); err != nil {
		s.t.Errorf("send %s to %s: %v", m.MessageType(), dst, err)
	}
}

// await returns the first reply on ch that ok accepts, re-sending m every
// second, or nil after timeout.
func (s *segment) await(ch chan *dhcpv4.DHCPv4, m *dhcpv4.DHCPv4, ok func(*dhcpv4.DHCPv4) bool, timeout time.Duration) *dhcpv4.DHCPv4 {
	s.send(m, bcast67)
	deadline := time.After(timeout)
	resend := time.NewTicker(time.Second)
	defer resend.Stop()
	for {
		select {
		case r := <-ch:
			if ok(r) {
				return r
			}
		case <-resend.C:
			s.send(m, bcast67)
		case <-deadline:
			return nil
		}
	}
}

// dora runs one client's DISCOVER → first OFFER → REQUEST → ACK, from
// DISCOVER again after a NAK or silence, at most 20 times. It returns the
// ACKed address, the server that ACKed it and the NAKs it took.
func (s *segment) dora(hw net.HardwareAddr) (net.IP, net.IP, int) {
	naks := 0
	for range 20 {
		xid, ch := s.register()
		d, _ := dhcpv4.NewDiscovery(hw, dhcpv4.WithTransactionID(xid))
		offer := s.await(ch, d, func(r *dhcpv4.DHCPv4) bool { return r.MessageType() == dhcpv4.MessageTypeOffer }, 3*time.Second)
		if offer == nil {
			s.unregister(xid)
			continue
		}
		sid := offer.ServerIdentifier()
		req, _ := dhcpv4.NewRequestFromOffer(offer)
		r := s.await(ch, req, func(r *dhcpv4.DHCPv4) bool {
			t := r.MessageType()
			return (t == dhcpv4.MessageTypeAck || t == dhcpv4.MessageTypeNak) && r.ServerIdentifier().Equal(sid)
		}, 3*time.Second)
		s.unregister(xid)
		switch {
		case r == nil:
		case r.MessageType() == dhcpv4.MessageTypeAck:
			if !r.YourIPAddr.Equal(offer.YourIPAddr) {
				s.t.Errorf("%s: ACK for %s, offered %s", hw, r.YourIPAddr, offer.YourIPAddr)
			}
			return r.YourIPAddr, sid, naks
		default:
			naks++
		}
	}
	return nil, nil, naks
}

// release sends hw's RELEASE of ip to server (unicast, as a client does).
func (s *segment) release(hw net.HardwareAddr, ip, server net.IP) {
	m, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(hw), dhcpv4.WithClientIP(ip),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)))
	s.send(m, &net.UDPAddr{IP: server, Port: 67})
}

// waitServers waits until each server answers a DISCOVER. The probe says
// it has waited 30 s (secs), which every appliance of a fleet answers
// whichever of them the MAC falls to (--dhcp-balance-max-secs).
func (s *segment) waitServers(servers []string, timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	probe := net.HardwareAddr{0x52, 0x54, 0x00, 0xf0, 0x00, 0x01}
	for {
		d, _ := dhcpv4.NewDiscovery(probe)
		d.NumSeconds = 30
		seen := map[string]bool{}
		for _, r := range s.collect(d, len(servers), 2*time.Second) {
			seen[r.ServerIdentifier().String()] = true
		}
		missing := 0
		for _, sv := range servers {
			if !seen[sv] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("DHCP answers from %v within %s, want %v", keys(seen), timeout, servers)
		}
	}
}

// collect broadcasts m and returns the answers of up to n servers (one
// each) that arrive within timeout.
func (s *segment) collect(m *dhcpv4.DHCPv4, n int, timeout time.Duration) []*dhcpv4.DHCPv4 {
	xid, ch := s.register()
	defer s.unregister(xid)
	m.TransactionID = xid
	s.send(m, bcast67)
	var out []*dhcpv4.DHCPv4
	seen := map[string]bool{}
	deadline := time.After(timeout)
	for len(out) < n {
		select {
		case r := <-ch:
			if sid := r.ServerIdentifier().String(); !seen[sid] {
				seen[sid] = true
				out = append(out, r)
			}
		case <-deadline:
			return out
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// nsExec runs a command in namespace ns.
func nsExec(ns string, args ...string) ([]byte, error) {
	return exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
}

// s4 names the servers of answers.
func s4(rs []*dhcpv4.DHCPv4) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.ServerIdentifier().String())
	}
	return out
}
