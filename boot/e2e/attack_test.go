package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// TestAttackDHCP is the DHCP attacks of docs/security.md ("DHCP
// under spoofing") against the built corrald
// (full mode on a bridge in a namespace), from a client namespace that
// sends raw DHCP with spoofed MACs:
//   - an INIT-REBOOT REQUEST from a MAC with no lease gets no answer and
//     no lease is written (RFC 2131 §4.3.2);
//   - a DECLINE from a MAC that holds nothing does not quarantine the
//     address: another client is then offered and leased it (and the
//     holder's own DECLINE does quarantine it);
//   - garbage, truncated and oversize (past 4 KiB) packets are dropped, the server keeps
//     answering, and the warning is rate-limited;
//   - a flood of DISCOVERs from spoofed network-booting MACs past
//     --max-discovered creates no more machines than the cap, and those
//     past it get no boot file;
//   - restarted with a short --discovered-gc-after, the appliance deletes
//     the stale placeholders and their timelines.
func TestAttackDHCP(t *testing.T) {
	need(t)
	l := newLab(t)
	clientNS, clientIf := l.peer("a", "")
	l.ipn(clientNS, "route", "add", "default", "dev", clientIf)
	const maxDiscovered = 5
	args := []string{"--dhcp-mode", "full", "--dhcp-range", l.subnet + ".100-" + l.subnet + ".150", "--tftp-listen", "off", "--no-ra",
		"--max-discovered", "5"}
	c := l.corrald(args...)
	server := net.ParseIP(l.subnet + ".1").To4()
	cl := udpIn(t, clientNS, "0.0.0.0:68")
	inNS(t, clientNS, func() {
		rc, _ := cl.SyscallConn()
		rc.Control(func(fd uintptr) { setBroadcast(fd) })
	})
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	hw := func(i byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0x00, 0xa7, 0x00, i} }
	ip := func(host string) net.IP { return net.ParseIP(l.subnet + "." + host).To4() }
	// dora runs DISCOVER (asking for want, when given) → OFFER → REQUEST
	// → ACK and returns the offer.
	dora := func(mac net.HardwareAddr, want net.IP) *dhcpv4.DHCPv4 {
		t.Helper()
		var mods []dhcpv4.Modifier
		if want != nil {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(want)))
		}
		d, _ := dhcpv4.NewDiscovery(mac, mods...)
		pxeOpts(d)
		offer := exchange(t, cl, d, bcast, 5*time.Second)
		if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
			t.Fatalf("%s: no OFFER (got %v)", mac, offer)
		}
		req, _ := dhcpv4.NewRequestFromOffer(offer)
		pxeOpts(req)
		if ack := exchange(t, cl, req, bcast, 5*time.Second); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("%s: no ACK for %s (got %v)", mac, offer.YourIPAddr, ack)
		}
		return offer
	}

	// 1. INIT-REBOOT from a MAC with no lease: silence.
	spoof, wanted := hw(1), ip("120")
	req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(spoof),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(wanted)))
	pxeOpts(req)
	if r := exchange(t, cl, req, bcast, 3*time.Second); r != nil {
		t.Fatalf("INIT-REBOOT from a MAC with no lease was answered: %v", r)
	}
	c.waitTimeline(spoof.String(), []want{{"dhcp", "ignored", map[string]string{"state": "init-reboot", "ip": wanted.String()}}}, 10*time.Second)

	// 2. DECLINE of a free address from a MAC that holds nothing: ignored.
	decliner, target := hw(2), ip("101")
	dec, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithHwAddr(decliner),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(target)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)))
	if _, err := cl.WriteTo(dec.ToBytes(), bcast); err != nil {
		t.Fatal(err)
	}
	c.waitTimeline(decliner.String(), []want{{"dhcp", "ignored", map[string]string{"ip": target.String()}}}, 10*time.Second)
	holder := hw(3)
	if got := dora(holder, target).YourIPAddr; !got.Equal(target) {
		t.Fatalf("after a DECLINE from a MAC holding nothing, %s was not offered %s (got %s): it was quarantined", holder, target, got)
	}
	// The holder's own DECLINE does quarantine it.
	dec.ClientHWAddr, dec.TransactionID = holder, dhcpv4.TransactionID{9, 9, 9, 9}
	if _, err := cl.WriteTo(dec.ToBytes(), bcast); err != nil {
		t.Fatal(err)
	}
	c.waitTimeline(holder.String(), []want{{"dhcp", "decline", map[string]string{"ip": target.String()}}}, 10*time.Second)
	if got := dora(hw(4), target).YourIPAddr; got.Equal(target) {
		t.Fatalf("%s offered although its holder declined it", target)
	}

	// 3. Garbage and truncated packets: dropped, still serving.
	raw := req.ToBytes()
	for i := 0; i < 200; i++ {
		junk := make([]byte, i*7%600)
		rand.Read(junk)
		cl.WriteTo(junk, bcast)
		cl.WriteTo(raw[:i%len(raw)], bcast)
	}
	// Datagrams past the server's 4 KiB read buffer (the socket read cuts
	// them there, and the rest is junk): dropped too.
	for _, n := range []int{4097, 9000, 65000} {
		junk := make([]byte, n)
		rand.Read(junk)
		if _, err := cl.WriteTo(junk, bcast); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
	}
	dora(hw(5), nil)

	// 4. A flood of network-booting spoofed MACs past the cap (3 machines
	// exist: holder, hw(4), hw(5)).
	const flood = 40
	sent := map[dhcpv4.TransactionID]bool{}
	for i := 0; i < flood; i++ {
		mac := make(net.HardwareAddr, 6)
		rand.Read(mac)
		mac[0] = 0x02
		d, _ := dhcpv4.NewDiscovery(mac)
		pxeOpts(d)
		sent[d.TransactionID] = true
		cl.WriteTo(d.ToBytes(), bcast)
	}
	offers, booting := collect(t, cl, sent, 5*time.Second)
	if ms := machineCount(t, c); ms != maxDiscovered {
		t.Errorf("%d machines after the flood, want the cap, %d", ms, maxDiscovered)
	}
	if booting > maxDiscovered-3 {
		t.Errorf("%d flood clients got a boot file; room was left for %d", booting, maxDiscovered-3)
	}
	if offers < flood-5 {
		t.Errorf("only %d of %d flood clients got an OFFER: the cap must not stop DHCP", offers, flood)
	}
	logText, _ := os.ReadFile(c.log)
	for msg, most := range map[string]int{
		"ignoring malformed DHCP packet":                        1,
		"discovered-machine cap reached":                        1,
		"unknown network-booting MAC not recorded":              1,
		"INIT-REBOOT REQUEST from a client with no lease":       1,
		"DECLINE from a client that neither holds nor was offe": 1,
	} {
		if n := strings.Count(string(logText), msg); n < 1 || n > most {
			t.Errorf("log has %q %d times, want 1..%d (rate-limited)", msg, n, most)
		}
	}

	// 5. Restarted with a short --discovered-gc-after: the stale
	// placeholders (every machine here) and their timelines are deleted.
	c.stop(t)
	c = l.corrald(append(args, "--discovered-gc-after", "2s")...)
	deadline := time.Now().Add(30 * time.Second)
	for machineCount(t, c) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d discovered machines left 30 s after a restart with --discovered-gc-after 2s", machineCount(t, c))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if es := c.timeline(holder.String()); len(es) != 0 {
		t.Errorf("a collected machine's timeline is left:\n%s", render(es))
	}
	logText, _ = os.ReadFile(c.log)
	if n := strings.Count(string(logText), "stale discovered machine deleted"); n != maxDiscovered {
		t.Errorf("%d deletions logged, want %d", n, maxDiscovered)
	}

	// 6. The store: the INIT-REBOOT and DECLINE senders hold no lease.
	c.stop(t)
	st, err := bolt.Open(filepath.Join(c.dataDir, "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	kvs, err := st.List(context.Background(), dhcp.LeasePrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		var le bootv1.Lease
		if err := record.Unmarshal(kv.Value, &le); err != nil {
			t.Fatal(err)
		}
		if le.GetMac() == spoof.String() || le.GetMac() == decliner.String() || le.GetIp() == wanted.String() {
			t.Errorf("lease written for an attacker: %v", &le)
		}
	}
}

// collect reads replies to the transactions in sent until timeout and
// returns how many OFFERs came back and how many of them carry a boot
// file.
func collect(t *testing.T, c *net.UDPConn, sent map[dhcpv4.TransactionID]bool, timeout time.Duration) (offers, booting int) {
	t.Helper()
	seen := map[dhcpv4.TransactionID]bool{}
	buf := make([]byte, 1500)
	deadline := time.Now().Add(timeout)
	for len(seen) < len(sent) {
		c.SetReadDeadline(deadline)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			break
		}
		r, err := dhcpv4.FromBytes(buf[:n])
		if err != nil || !sent[r.TransactionID] || seen[r.TransactionID] || r.MessageType() != dhcpv4.MessageTypeOffer {
			continue
		}
		seen[r.TransactionID] = true
		offers++
		if r.BootFileName != "" {
			booting++
		}
	}
	return offers, booting
}

func machineCount(t *testing.T, c *corrald) int {
	t.Helper()
	out, err := c.cli("get", "machines", "-o", "json")
	if err != nil {
		t.Fatalf("corral get machines: %v\n%s", err, out)
	}
	var ms []json.RawMessage
	if err := json.Unmarshal(out, &ms); err != nil {
		t.Fatalf("get machines json: %v\n%s", err, out)
	}
	return len(ms)
}
