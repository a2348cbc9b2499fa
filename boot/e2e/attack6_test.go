package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp6"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// TestAttackDHCPv6 is the hostile-LAN rules of docs/architecture.md
// ("DHCPv6 and IPv6 boot") against the built corrald on an IPv6-only
// bridge, from a client namespace sending raw DHCPv6:
//   - another client's address cannot be taken: REQUEST naming it gets
//     another address, RENEW/REBIND/RELEASE/DECLINE of it get NoBinding,
//     and its holder still renews it;
//   - a Relay-Forward claiming the victim's MAC (option 79) from a source
//     outside --dhcp6-relay-from is dropped and counted; the allowed relay
//     is served;
//   - garbage, truncated, oversized and deeply nested packets are dropped,
//     counted and logged once (rate-limited); the server keeps answering;
//   - the victim's iPXE script is refused to an address that does not
//     hold its lease, and given to the one that does;
//   - a flood of SOLICITs with random DUIDs binds no more than the range
//     and records no more machines than --max-discovered;
//   - /metrics counts every datagram by type and outcome and the range's
//     bound and free addresses.
func TestAttackDHCPv6(t *testing.T) {
	need(t)
	l, prefix := newLab6(t)
	relayLink := "fd78:" + l.id[:4] + "::"
	const maxDiscovered = 5
	c := l.corrald("--dhcp-mode", "off", "--dhcp6-range", prefix+"100-"+prefix+"1ff", "--tftp-listen", "off",
		"--dhcp6-relay-range", relayLink+"/64="+relayLink+"100-"+relayLink+"1ff", "--dhcp6-relay-from", prefix+"fe",
		"--max-discovered", strconv.Itoa(maxDiscovered), "--metrics-listen", "[::1]:9180")
	ns, ifname := l.peer("a", prefix+"50/64")
	l.ipn(ns, "addr", "add", prefix+"fe/64", "dev", ifname, "nodad")
	waitNoTentative(t, ns, ifname)
	cl := udp6In(t, ns, "[::]:546")
	relay := udp6In(t, ns, "["+prefix+"fe]:547")
	allServers := &net.UDPAddr{IP: net.ParseIP("ff02::1:2"), Port: 547, Zone: ifname}
	server := &net.UDPAddr{IP: net.ParseIP(prefix + "1"), Port: 547}

	var serverID dhcpv6.DUID
	var xid byte
	ask := func(conn *net.UDPConn, m dhcpv6.DHCPv6, dst *net.UDPAddr, timeout time.Duration) dhcpv6.DHCPv6 {
		t.Helper()
		xid++
		inner, err := m.GetInnerMessage()
		if err != nil {
			t.Fatal(err)
		}
		inner.TransactionID = dhcpv6.TransactionID{0xa6, 0, xid}
		if _, err := conn.WriteTo(m.ToBytes(), dst); err != nil {
			t.Fatalf("send: %v", err)
		}
		buf := make([]byte, 9000)
		deadline := time.Now().Add(timeout)
		for {
			conn.SetReadDeadline(deadline)
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return nil
			}
			d, err := dhcpv6.FromBytes(buf[:n])
			if err != nil {
				continue
			}
			if in, err := d.GetInnerMessage(); err == nil && in.TransactionID == inner.TransactionID {
				return d
			}
		}
	}
	message := func(typ dhcpv6.MessageType, id dhcpv6.DUID, iaAddrs []netip.Addr, opts ...dhcpv6.Option) *dhcpv6.Message {
		m := &dhcpv6.Message{MessageType: typ}
		m.AddOption(dhcpv6.OptClientID(id))
		if serverID != nil && typ != dhcpv6.MessageTypeSolicit && typ != dhcpv6.MessageTypeRebind {
			m.AddOption(dhcpv6.OptServerID(serverID))
		}
		m.AddOption(dhcpv6.OptClientArchType(iana.EFI_X86_64))
		m.AddOption(&dhcpv6.OptVendorClass{EnterpriseNumber: 343, Data: [][]byte{[]byte("PXEClient:Arch:00007:UNDI:003000")}})
		m.AddOption(dhcpv6.OptRequestedOption(dhcpv6.OptionBootfileURL))
		ia := &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, 1}}
		for _, a := range iaAddrs {
			ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: a.AsSlice()})
		}
		m.AddOption(ia)
		for _, o := range opts {
			m.AddOption(o)
		}
		return m
	}
	rapid := &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit}
	addrOf := func(d dhcpv6.DHCPv6) (netip.Addr, iana.StatusCode) {
		m, _ := d.(*dhcpv6.Message)
		if m == nil {
			return netip.Addr{}, 0xffff
		}
		ia := m.Options.OneIANA()
		if ia == nil {
			return netip.Addr{}, 0xfffe
		}
		if st := ia.Options.Status(); st != nil && st.StatusCode != iana.StatusSuccess {
			return netip.Addr{}, st.StatusCode
		}
		if a := ia.Options.OneAddress(); a != nil {
			ip, _ := netip.AddrFromSlice(a.IPv6Addr)
			return ip, iana.StatusSuccess
		}
		return netip.Addr{}, 0xfffd
	}
	hw := func(i byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0x00, 0xa6, 0x00, i} }
	duidLL := func(m net.HardwareAddr) dhcpv6.DUID {
		return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: m}
	}

	// 1. The victim binds an address (Rapid Commit).
	victim, victimDUID := hw(1), duidLL(hw(1))
	rep := ask(cl, message(dhcpv6.MessageTypeSolicit, victimDUID, nil, rapid), allServers, 5*time.Second)
	va, st := addrOf(rep)
	if st != iana.StatusSuccess {
		t.Fatalf("victim's Rapid Commit SOLICIT: %v (status %v)", rep, st)
	}
	serverID = rep.(*dhcpv6.Message).Options.ServerID()
	t.Logf("victim %s bound %s", victim, va)

	// 2. The attacker (its own DUID) names the victim's address.
	atk := duidLL(hw(2))
	if a, _ := addrOf(ask(cl, message(dhcpv6.MessageTypeRequest, atk, []netip.Addr{va}), allServers, 5*time.Second)); a == va {
		t.Errorf("REQUEST naming the victim's address was given it")
	}
	for _, typ := range []dhcpv6.MessageType{dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline} {
		d := ask(cl, message(typ, atk, []netip.Addr{va}), allServers, 5*time.Second)
		if a, st := addrOf(d); st != iana.StatusNoBinding {
			t.Errorf("%s of the victim's address by another DUID: address %v status %v, want NoBinding", typ, a, st)
		}
	}
	// A DUID-LL spoofing the victim's MAC under another IAID is another
	// binding: it gets another address and leaves the victim's alone.
	spoof := message(dhcpv6.MessageTypeSolicit, victimDUID, nil, rapid)
	spoof.Options.Del(dhcpv6.OptionIANA)
	spoof.AddOption(&dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, 9}})
	if a, _ := addrOf(ask(cl, spoof, allServers, 5*time.Second)); a == va {
		t.Errorf("a second IAID of the victim's DUID was given the victim's address")
	}
	if a, st := addrOf(ask(cl, message(dhcpv6.MessageTypeRenew, victimDUID, []netip.Addr{va}), allServers, 5*time.Second)); a != va {
		t.Fatalf("the victim's RENEW after the attacks: %v %v", a, st)
	}

	// 3. Relay-Forward with the victim's MAC in option 79 from the
	// attacker's link-local source (not an allowed relay): silence.
	fwd := func(inner dhcpv6.DHCPv6) *dhcpv6.RelayMessage {
		r := &dhcpv6.RelayMessage{MessageType: dhcpv6.MessageTypeRelayForward, LinkAddr: net.ParseIP(relayLink + "1"), PeerAddr: net.ParseIP("fe80::99")}
		r.Options.Add(dhcpv6.OptClientLinkLayerAddress(iana.HWTypeEthernet, victim))
		r.Options.Add(dhcpv6.OptRelayMessage(inner))
		return r
	}
	claim := fwd(message(dhcpv6.MessageTypeSolicit, &dhcpv6.DUIDUUID{UUID: [16]byte{6, 6}}, nil, rapid))
	if d := ask(cl, claim, allServers, 3*time.Second); d != nil {
		t.Errorf("Relay-Forward from a source that is not an allowed relay answered: %v", d)
	}
	// The allowed relay (fd77:..::fe) is served from the relayed range.
	d := ask(relay, fwd(message(dhcpv6.MessageTypeSolicit, &dhcpv6.DUIDUUID{UUID: [16]byte{7, 7}}, nil, rapid)), server, 5*time.Second)
	if rr, ok := d.(*dhcpv6.RelayMessage); !ok || rr.MessageType != dhcpv6.MessageTypeRelayReply {
		t.Fatalf("the allowed relay's Relay-Forward answered %v", d)
	} else if in, _ := rr.GetInnerMessage(); in != nil {
		if a, _ := addrOf(in); !strings.HasPrefix(a.String(), relayLink) {
			t.Errorf("relayed client got %s, want one in %s/64", a, relayLink)
		}
	}

	// 4. Malformed, truncated, oversized and deeply nested: dropped.
	raw := message(dhcpv6.MessageTypeSolicit, duidLL(hw(3)), nil).ToBytes()
	const junk = 100
	for i := range junk {
		b := make([]byte, i*13%700)
		rand.Read(b)
		if len(b) > 0 {
			b[0] = byte(1 + i%3) // a client message type, so parsing is tried
		}
		cl.WriteTo(b, allServers)
		cl.WriteTo(raw[:i%len(raw)], allServers)
	}
	for _, n := range []int{4097, 9000, 60000} {
		b := make([]byte, n)
		rand.Read(b)
		b[0] = 1
		if _, err := cl.WriteTo(b, allServers); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
	}
	var deep dhcpv6.DHCPv6 = message(dhcpv6.MessageTypeSolicit, duidLL(hw(4)), nil, rapid)
	for range 30 {
		deep = &dhcpv6.RelayMessage{MessageType: dhcpv6.MessageTypeRelayForward, LinkAddr: net.ParseIP(relayLink + "1"), PeerAddr: net.ParseIP("fe80::1"),
			Options: dhcpv6.RelayOptions{Options: dhcpv6.Options{dhcpv6.OptRelayMessage(deep)}}}
	}
	if d := ask(relay, deep, server, 3*time.Second); d != nil {
		t.Errorf("30 nested relays answered: %v", d)
	}
	if a, _ := addrOf(ask(cl, message(dhcpv6.MessageTypeRenew, victimDUID, []netip.Addr{va}), allServers, 5*time.Second)); a != va {
		t.Fatalf("the server stopped answering after the junk")
	}

	// 5. The victim's script: refused to an address not holding its
	// lease, served to the one that does.
	script := func(src string) int {
		t.Helper()
		var code int
		inNS(t, ns, func() {
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
			conn, err := dl.Dial("tcp", "["+prefix+"1]:8080")
			if err != nil {
				t.Fatalf("dial from %s: %v", src, err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "GET /boot.ipxe?mac=%s HTTP/1.0\r\nHost: [%s1]:8080\r\n\r\n", victim, prefix)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, _ := bufio.NewReader(conn).ReadString('\n')
			if f := strings.Fields(line); len(f) > 1 {
				code, _ = strconv.Atoi(f[1])
			}
		})
		return code
	}
	if code := script(prefix + "50"); code != 403 {
		t.Errorf("the victim's script from %s50 (no lease): %d, want 403", prefix, code)
	}
	if code := script(prefix + "fe"); code != 403 {
		t.Errorf("the victim's script from %sfe (no lease): %d, want 403", prefix, code)
	}
	l.ipn(ns, "addr", "add", va.String()+"/64", "dev", ifname, "nodad")
	if code := script(va.String()); code != 200 {
		t.Errorf("the victim's script from its own leased address %s: %d, want 200", va, code)
	}

	// 6. A flood of SOLICITs with random DUIDs (Rapid Commit, network
	// booting): bounded by the range (256) and --max-discovered.
	const flood = 400
	for i := range flood {
		m := make(net.HardwareAddr, 6)
		rand.Read(m)
		m[0] = 0x02
		msg := message(dhcpv6.MessageTypeSolicit, duidLL(m), nil, rapid)
		msg.TransactionID = dhcpv6.TransactionID{0xf1, byte(i >> 8), byte(i)}
		cl.WriteTo(msg.ToBytes(), allServers)
		if i%50 == 49 {
			time.Sleep(50 * time.Millisecond) // the veth's and socket's queues, not the server, would drop a burst
		}
	}
	time.Sleep(3 * time.Second)
	if ms := machineCount(t, c); ms > maxDiscovered {
		t.Errorf("%d machines after the flood, want at most --max-discovered %d", ms, maxDiscovered)
	}
	// The holder still renews, retransmitting as a client does (RFC 8415
	// §18.2.4) while the server may still be working off the flood.
	renewed := false
	for try := 0; try < 4 && !renewed; try++ {
		a, _ := addrOf(ask(cl, message(dhcpv6.MessageTypeRenew, victimDUID, []netip.Addr{va}), allServers, 5*time.Second))
		renewed = a == va
	}
	if !renewed {
		t.Errorf("the victim's RENEW after the flood failed (4 tries, 5 s each)")
	}

	// 7. /metrics.
	m := scrape(t, l.ns, "[::1]:9180")
	for _, w := range []struct {
		re      string
		atLeast float64
	}{
		{`corral_dhcp6_packets_total{outcome="reply",type="solicit"}`, 3},
		{`corral_dhcp6_packets_total{outcome="reply",type="renew"}`, 3},
		{`corral_dhcp6_packets_total{outcome="relay_refused",type="relay-forward"}`, 1},
		{`corral_dhcp6_packets_total{outcome="malformed",type="other"}`, junk},
		{`corral_dhcp6_packets_total{outcome="malformed",type="relay-forward"}`, 1},
	} {
		if v, ok := m[w.re]; !ok || v < w.atLeast {
			t.Errorf("%s = %v (present %v), want >= %v", w.re, v, ok, w.atLeast)
		}
	}
	local := fmt.Sprintf(`range="%s100-%s1ff"`, prefix, prefix)
	bound, free := m[`corral_dhcp6_leases{`+local+`,state="bound"}`], m[`corral_dhcp6_leases{`+local+`,state="free"}`]
	t.Logf("after the flood: local range bound %v free %v", bound, free)
	if bound < 200 || bound > 256 || bound+free > 256 {
		t.Errorf("corral_dhcp6_leases local range: bound %v free %v, want the flood to fill most of the 256 and no more", bound, free)
	}
	logText, _ := os.ReadFile(c.log)
	for msg, most := range map[string]int{
		"dropping malformed DHCPv6 packet": 1,
		"not an allowed relay":             1,
	} {
		if n := strings.Count(string(logText), msg); n < 1 || n > most {
			t.Errorf("log has %q %d times, want 1..%d (rate-limited)", msg, n, most)
		}
	}

	// 8. The store: the victim's lease is its own; at most 256 local
	// leases; none names the victim's MAC but the victim's own IAIDs.
	c.stop(t)
	stb, err := bolt.Open(filepath.Join(c.dataDir, "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stb.Close()
	kvs, err := stb.List(context.Background(), dhcp6.LeasePrefix)
	if err != nil {
		t.Fatal(err)
	}
	locals := 0
	for _, kv := range kvs {
		var le bootv1.Lease
		if err := record.Unmarshal(kv.Value, &le); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(le.GetIp(), prefix) {
			locals++
		}
		if le.GetIp() == va.String() && (le.GetMac() != victim.String() || le.GetIaid() != 1) {
			t.Errorf("the victim's address is held by %v", &le)
		}
	}
	if locals > 256 {
		t.Errorf("%d local leases stored, the range holds 256", locals)
	}
	t.Logf("%d DHCPv6 lease records stored", len(kvs))
}

// udp6In opens an IPv6 UDP socket on addr inside namespace ns.
func udp6In(t *testing.T, ns, addr string) *net.UDPConn { return udpNetIn(t, ns, "udp6", addr) }

// waitNoTentative waits for ifname's IPv6 addresses (its link-local one
// included) to finish duplicate address detection.
func waitNoTentative(t *testing.T, ns, ifname string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", ns, "-6", "addr", "show", "dev", ifname, "tentative").CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s: addresses still tentative:\n%s", ifname, ns, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scrape reads /metrics at addr inside ns: sample (name{labels}) → value.
func scrape(t *testing.T, ns, addr string) map[string]float64 {
	t.Helper()
	var body []byte
	inNS(t, ns, func() {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("metrics: %v", err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		body, _ = io.ReadAll(conn)
	})
	out := map[string]float64{}
	line := regexp.MustCompile(`^(\S+\}?) (\S+)$`)
	for _, l := range strings.Split(string(body), "\n") {
		if m := line.FindStringSubmatch(l); m != nil && !strings.HasPrefix(l, "#") {
			if v, err := strconv.ParseFloat(m[2], 64); err == nil {
				out[m[1]] = v
			}
		}
	}
	return out
}
