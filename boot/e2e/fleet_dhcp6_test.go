package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp6"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestFleetDHCPv6SharedSegment runs two built corrald with the same
// 64-address DHCPv6 range on one bridge, their leases in a real etcd,
// and 55 raw DHCPv6 clients on the segment that multicast to both:
//   - a SOLICIT with Rapid Commit is answered ADVERTISE by both (in a
//     fleet Rapid Commit would bind one client on each appliance);
//   - then every client runs the four-message exchange at once,
//     REQUESTing the first ADVERTISE's address from the server that sent
//     it (the appliances' offers are not shared, so a REQUEST may lose
//     the compare-and-swap: the server then tries the next free
//     addresses, else answers NoAddrsAvail and the client SOLICITs
//     again).
//
// No address is ever bound to two DUIDs (as the clients saw the REPLYs),
// every client ends with an address, and etcd's live leases are exactly
// the addresses each DUID was last given.
func TestFleetDHCPv6SharedSegment(t *testing.T) {
	need(t, "etcd")
	cluster := etcdtest.New(t, 1)
	l := newLab(t)
	prefix := "fd79:" + l.id[:4] + "::"
	l.ipn(l.ns, "addr", "add", prefix+"1/64", "dev", l.bridge, "nodad")
	bNS, bIf := l.peer("b", l.subnet+".2/24")
	l.ipn(bNS, "addr", "add", prefix+"2/64", "dev", bIf, "nodad")
	cNS, cIf := l.peer("c", "")
	waitNoTentative(t, bNS, bIf)
	waitNoTentative(t, cNS, cIf)
	forwardEtcd(t, l.ns, cluster)
	forwardEtcd(t, bNS, cluster)

	const storePrefix = "/fleetdhcp6"
	args := []string{"--store", "etcd", "--etcd-endpoints", cluster.EndpointsFlag(), "--etcd-prefix", storePrefix,
		"--dhcp-mode", "off", "--dhcp6-range", prefix + "100-" + prefix + "13f", "--tftp-listen", "off", "--no-ra", "--leader-lease-ttl", "3s",
		"--metrics-listen", ""}
	dirA := filepath.Join(l.dir, "a")
	l.appliance(l.ns, l.bridge, "a", dirA, dirA, args...)
	l.appliance(bNS, bIf, "b", filepath.Join(l.dir, "b"), dirA, append(args, "--cluster-key", filepath.Join(dirA, "cluster.key"))...)

	conn := udp6In(t, cNS, "[::]:546")
	conn.SetReadBuffer(4 << 20)
	dst := &net.UDPAddr{IP: net.ParseIP("ff02::1:2"), Port: 547, Zone: cIf}
	var mu sync.Mutex
	replies := map[dhcpv6.TransactionID][]*dhcpv6.Message{}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if m, err := dhcpv6.MessageFromBytes(buf[:n]); err == nil {
				mu.Lock()
				replies[m.TransactionID] = append(replies[m.TransactionID], m)
				mu.Unlock()
			}
		}
	}()
	newMsg := func(typ dhcpv6.MessageType, id dhcpv6.DUID, opts ...dhcpv6.Option) *dhcpv6.Message {
		m := &dhcpv6.Message{MessageType: typ}
		rand.Read(m.TransactionID[:])
		m.AddOption(dhcpv6.OptClientID(id))
		m.AddOption(dhcpv6.OptElapsedTime(0))
		for _, o := range opts {
			m.AddOption(o)
		}
		return m
	}
	bound := func(m *dhcpv6.Message) string {
		if ia := m.Options.OneIANA(); ia != nil {
			if a := ia.Options.OneAddress(); a != nil && a.ValidLifetime > 0 {
				return a.IPv6Addr.String()
			}
		}
		return ""
	}
	// byAddr: address → DUIDs it was bound to; last: DUID → its last
	// address; servers: server DUID → bindings it made.
	byAddr, last, servers := map[string]map[string]bool{}, map[string]string{}, map[string]int{}
	note := func(client string, m *dhcpv6.Message) bool {
		a := bound(m)
		if m.MessageType != dhcpv6.MessageTypeReply || a == "" {
			return false
		}
		if byAddr[a] == nil {
			byAddr[a] = map[string]bool{}
		}
		byAddr[a][client] = true
		last[client] = a
		servers[hex.EncodeToString(m.Options.ServerID().ToBytes())]++
		return true
	}
	// wait returns the answers to xid after timeout (or once n came).
	wait := func(xid dhcpv6.TransactionID, n int, timeout time.Duration) []*dhcpv6.Message {
		deadline := time.Now().Add(timeout)
		for {
			mu.Lock()
			rs := replies[xid]
			mu.Unlock()
			if len(rs) >= n || time.Now().After(deadline) {
				return rs
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ia := func() dhcpv6.Option { return &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, 1}} }
	duidOf := func(i int) dhcpv6.DUID {
		return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: net.HardwareAddr{0x52, 0x54, 0x00, 0xf6, byte(i >> 8), byte(i)}}
	}

	// Both appliances answer (each makes its own ADVERTISE).
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := newMsg(dhcpv6.MessageTypeSolicit, duidOf(999), ia())
		conn.WriteTo(m.ToBytes(), dst)
		if rs := wait(m.TransactionID, 2, 2*time.Second); len(rs) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("two ADVERTISEs never came: both appliances are not serving DHCPv6")
		}
	}

	// Rapid Commit is not honoured in a fleet: both appliances
	// ADVERTISE and bind nothing.
	const rapidN, fourN = 30, 25
	for i := range rapidN {
		m := newMsg(dhcpv6.MessageTypeSolicit, duidOf(i), ia(), &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
		conn.WriteTo(m.ToBytes(), dst)
		for _, r := range wait(m.TransactionID, 2, 2*time.Second) {
			if r.MessageType != dhcpv6.MessageTypeAdvertise {
				t.Errorf("Rapid Commit SOLICIT in a fleet answered %s, want ADVERTISE", r.MessageType)
			}
		}
	}
	// Wave 2: SOLICIT → first ADVERTISE → REQUEST to its server, again
	// from SOLICIT when the REQUEST loses (at most 5 tries).
	var wg sync.WaitGroup
	var nmu sync.Mutex
	for i := range rapidN + fourN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := duidOf(i)
			client := hex.EncodeToString(id.ToBytes())
			for range 5 {
				sol := newMsg(dhcpv6.MessageTypeSolicit, id, ia())
				conn.WriteTo(sol.ToBytes(), dst)
				var adv *dhcpv6.Message
				for _, r := range wait(sol.TransactionID, 1, 3*time.Second) {
					if r.MessageType == dhcpv6.MessageTypeAdvertise && bound(r) != "" {
						adv = r
						break
					}
				}
				if adv == nil {
					continue
				}
				o := &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, 1}}
				o.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP(bound(adv))})
				req := newMsg(dhcpv6.MessageTypeRequest, id, dhcpv6.OptServerID(adv.Options.ServerID()), o)
				conn.WriteTo(req.ToBytes(), dst)
				for _, r := range wait(req.TransactionID, 1, 3*time.Second) {
					nmu.Lock()
					ok := note(client, r)
					nmu.Unlock()
					if ok {
						return
					}
				}
			}
			t.Logf("four-message client %s gave up after 5 tries", client)
		}()
	}
	wg.Wait()

	for a, ds := range byAddr {
		if len(ds) > 1 {
			t.Errorf("%s was bound to %d DUIDs: %v", a, len(ds), keys(ds))
		}
	}
	if len(last) != rapidN+fourN {
		t.Errorf("%d of %d clients ended with an address", len(last), rapidN+fourN)
	}
	if len(servers) != 2 {
		t.Errorf("bindings by server: %v, want both appliances", servers)
	}
	t.Logf("bindings by server DUID: %v; %d addresses bound", servers, len(byAddr))

	st, err := etcd.Open(context.Background(), etcd.Options{Endpoints: cluster.Endpoints(), Prefix: storePrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ls, err := record.List(context.Background(), st, dhcp6.LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]map[string]bool{} // DUID → its live addresses
	now := time.Now().Unix()
	for _, le := range ls {
		if le.GetState() == bootv1.Lease_STATE_ACTIVE && now < le.GetExpiresUnix() {
			if live[le.GetDuid()] == nil {
				live[le.GetDuid()] = map[string]bool{}
			}
			live[le.GetDuid()][le.GetIp()] = true
		}
	}
	extra := 0
	for client, a := range last {
		if !live[client][a] {
			t.Errorf("client %s was last given %s; etcd's live leases for it: %v", client, a, keys(live[client]))
		}
		extra += len(live[client]) - 1
	}
	if len(live) != len(last) {
		t.Errorf("etcd has live leases for %d DUIDs, the clients are %d", len(live), len(last))
	}
	// A second live lease of one DUID would be both appliances binding a
	// Rapid Commit client, each to another address (the client keeps one,
	// the other is wasted until it expires).
	t.Logf("%d live lease records in etcd beyond one per client", extra)
}
