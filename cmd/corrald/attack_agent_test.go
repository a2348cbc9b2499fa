package main

// Attack tests for the boot credentials (docs/security.md, "Per-boot
// credentials", and the agent's share of "Every resource bounded"),
// against the built corrald: boot HTTP on loopback (DHCP off,
// so any address may fetch any known MAC's script: the per-boot token on
// the kernel command line is public) or, for the lease check, in network
// namespaces with corrald's DHCP in full mode; plain HTTP for scripts and a
// real gRPC client over TLS for the agent edge. Each attack is refused with
// its status code, leaves the victim's machine record as it was, and is on
// the timeline.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// credCorrald is corrald with its boot HTTP server on loopback.
type credCorrald struct {
	t         *testing.T
	api, http string
	cc        *clientconfig.Config
	logs      *syncbuf.Buffer
	admin     *grpc.ClientConn
}

func startCredCorrald(t *testing.T, extra ...string) *credCorrald {
	t.Helper()
	needE2E(t)
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	c := &credCorrald{t: t, api: freePort(t), http: freePort(t), logs: &syncbuf.Buffer{}}
	dataDir := t.TempDir()
	args := append([]string{"serve", "--data-dir", dataDir, "--api-listen", c.api, "--boot-interface", "lo", "--dhcp-mode", "off",
		"--no-ra", "--tftp-listen", "off", "--http-listen", c.http, "--allow-test-images"}, extra...)
	cmd := exec.Command(filepath.Join(binDir, "corrald"), args...)
	cmd.Stdout, cmd.Stderr = c.logs, c.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("corrald logs:\n%s", c.logs)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if l := c.logs.String(); strings.Contains(l, "serving gRPC API") && strings.Contains(l, "serving boot HTTP") {
			break
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup, which waits for it
			t.Fatalf("corrald exited early: %v\n%s", err, c.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not start in 60s\n%s", c.logs)
		}
	}
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	c.cc = cc
	c.admin = c.dial(cc.Token)
	return c
}

// dial is a real gRPC client over TLS (the appliance CA) with token.
func (c *credCorrald) dial(token string) *grpc.ClientConn {
	c.t.Helper()
	conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: c.api, CACert: c.cc.CACert, Token: token})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return conn
}

func (c *credCorrald) agent(token string) nodev1.AgentServiceClient {
	return nodev1.NewAgentServiceClient(c.dial(token))
}

// script fetches mac's boot script over plain HTTP from a loopback source
// address.
func (c *credCorrald) script(mac, from string) (int, http.Header, string) {
	c.t.Helper()
	return httpGet(c.t, c.http, from, "/boot.ipxe?mac="+mac)
}

// token is mac's per-boot token, read off its script like anyone on the
// LAN can.
func (c *credCorrald) token(mac, from string) string {
	c.t.Helper()
	code, _, body := c.script(mac, from)
	if code != http.StatusOK {
		c.t.Fatalf("script of %s from %s: %d %s", mac, from, code, body)
	}
	return scriptToken(c.t, body)
}

func scriptToken(t *testing.T, body string) string {
	t.Helper()
	_, rest, ok := strings.Cut(body, "corral.token=")
	if !ok {
		t.Fatalf("no corral.token in the script:\n%s", body)
	}
	tok, _, _ := strings.Cut(rest, " ")
	return tok
}

func (c *credCorrald) machine(name string) *inventoryv1.Machine {
	c.t.Helper()
	m, err := inventoryv1.NewMachineServiceClient(c.admin).GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: name})
	if err != nil {
		c.t.Fatalf("GetMachine %s: %v", name, err)
	}
	return m
}

// waitEntry waits for an entry named event whose detail contains detail on
// mac's timeline (it is written asynchronously) and returns it.
func (c *credCorrald) waitEntry(mac, event, detail string) *inventoryv1.TimelineEntry {
	c.t.Helper()
	cl := inventoryv1.NewMachineServiceClient(c.admin)
	var last []*inventoryv1.TimelineEntry
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := cl.Timeline(context.Background(), &inventoryv1.TimelineRequest{Mac: mac, Limit: 500})
		if err != nil {
			c.t.Fatalf("Timeline %s: %v", mac, err)
		}
		last = resp.GetEntries()
		for _, e := range last {
			if e.GetEvent() == event && strings.Contains(e.GetDetail(), detail) {
				return e
			}
		}
	}
	var got []string
	for _, e := range last {
		got = append(got, e.GetEvent()+": "+e.GetDetail())
	}
	c.t.Fatalf("no %s entry containing %q on %s's timeline:\n%s", event, detail, mac, strings.Join(got, "\n"))
	return nil
}

// session opens an agent Session with id; on success it heartbeats every
// 2 s until the test ends and returns the appliance's messages after the
// first wait.
func session(t *testing.T, cl nodev1.AgentServiceClient, id string) (<-chan *nodev1.ApplianceMessage, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := cl.Session(ctx)
	if err != nil {
		return nil, err
	}
	beat := &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: id}}}
	if err := stream.Send(beat); err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if first.GetWait() == nil {
		t.Fatalf("first session message %v; want wait", first)
	}
	msgs := make(chan *nodev1.ApplianceMessage, 16)
	go func() {
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	go func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if stream.Send(beat) != nil {
					return
				}
			}
		}
	}()
	return msgs, nil
}

func wantCode(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Fatalf("%s: %v; want %s containing %q", what, err, code, text)
	}
}

// TestAttackAgentBootCredentials: an attacker with a machine on the boot
// LAN (its own script, any other MAC's script, the victim's serial) and no
// operator token.
func TestAttackAgentBootCredentials(t *testing.T) {
	c := startCredCorrald(t)
	ctx := context.Background()
	const (
		victim, attacker       = "52:54:00:aa:00:01", "52:54:00:bb:00:01"
		victimSN, victimUUID   = "SN-VICTIM-1", "6a1c0f3e-aaaa-4a5b-9c2d-000000000001"
		victimAddr, attackAddr = "127.0.1.1", "127.0.2.1"
	)
	victimFacts := machinefacts.QEMU(victimSN, victimUUID, victim)

	// The victim boots: its script, its token.
	tv := c.token(victim, victimAddr)
	// The attacker boots too: its own script and token.
	ta := c.token(attacker, attackAddr)

	var reg *nodev1.RegisterResponse
	t.Run("re-requesting the script keeps the booting machine's token", func(t *testing.T) {
		// While the victim's kernel loads, the attacker asks for its
		// script again and again (and reads the token: it is public).
		for i := range 5 {
			if got := c.token(victim, fmt.Sprintf("127.0.2.%d", 10+i)); got != tv {
				t.Fatalf("script %d of the victim's MAC carries another token: the booting victim's would be revoked", i)
			}
		}
		var err error
		if reg, err = c.agent(tv).Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: victimFacts}); err != nil {
			t.Fatalf("the victim's Register with the token of its script: %v", err)
		}
	})
	if reg == nil {
		t.FailNow()
	}
	mv := reg.GetMachineName()

	before := c.machine(mv)
	unchanged := func(t *testing.T) {
		t.Helper()
		if diff := cmp.Diff(before, c.machine(mv), protocmp.Transform()); diff != "" {
			t.Errorf("the victim's record changed (-before +after):\n%s", diff)
		}
	}
	refusals := []struct {
		name, token string
		facts       *inventoryv1.Facts
		detail      string   // in the error and on the timelines
		macs        []string // timelines the refusal is on
		event       string
	}{
		{"own token, victim's boot_mac, no serial", ta, machinefacts.QEMU("", "", victim),
			"the token was issued for boot MAC " + attacker + ", not " + victim, []string{attacker, victim}, "register-refused"},
		{"own token, victim's boot_mac and serial", ta, victimFacts,
			"the token was issued for boot MAC " + attacker, []string{attacker, victim}, "register-refused"},
		{"victim's public token, no serial", tv, machinefacts.QEMU("", "", victim),
			"the report carries no serial", []string{victim}, "register-conflict"},
		{"victim's public token, another serial", tv, machinefacts.QEMU("SN-EVIL", "", victim),
			`serial "SN-EVIL" is not the recorded "` + victimSN + `"`, []string{victim}, "register-conflict"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.agent(tc.token).Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: tc.facts})
			wantCode(t, "Register", err, codes.PermissionDenied, tc.detail)
			unchanged(t)
			for _, mac := range tc.macs {
				e := c.waitEntry(mac, tc.event, tc.detail)
				if tc.token == ta && (e.GetAttributes()["token_id"] != ta[4:20] || !strings.HasPrefix(e.GetAttributes()["peer"], "127.0.0.1:")) {
					t.Errorf("%s's entry lacks the token id or the peer: %v", mac, e.GetAttributes())
				}
			}
		})
	}

	// The victim registers and is about to open its session.
	reg, err := c.agent(tv).Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: victimFacts})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("session with another machine's session id", func(t *testing.T) {
		_, err := session(t, c.agent(ta), reg.GetSessionId())
		wantCode(t, "Session", err, codes.PermissionDenied, "was not issued to boot token "+ta[4:20])
		c.waitEntry(victim, "session-refused", "was not issued to")
	})
	victimSession, err := session(t, c.agent(tv), reg.GetSessionId())
	if err != nil {
		t.Fatalf("the victim's own session after the attempt: %v", err)
	}
	t.Run("second session while the first is alive", func(t *testing.T) {
		// The attacker has everything public: the victim's token (its
		// script) and its serial and UUID. Register is the residual risk
		// (identity matched); the session is not given.
		r2, err := c.agent(tv).Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: victimFacts})
		if err != nil {
			t.Fatal(err)
		}
		_, err = session(t, c.agent(tv), r2.GetSessionId())
		wantCode(t, "second Session", err, codes.FailedPrecondition, "already has a live agent session")
		c.waitEntry(victim, "session-refused", "already has a live agent session")
		// The install plan goes to the session that was there first.
		if _, err := inventoryv1.NewMachineServiceClient(c.admin).AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: mv}); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-victimSession:
			if m.GetInstall().GetMachineName() != mv {
				t.Fatalf("the victim's session got %v; want its install plan", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the victim's session got no install plan")
		}
	})
}

// TestAttackAgentScriptRateLimits: a MAC's scripts and an address's
// scripts are budgeted; over budget is 429 with Retry-After, on the
// timeline.
func TestAttackAgentScriptRateLimits(t *testing.T) {
	c := startCredCorrald(t, "--boot-script-mac-burst", "5", "--boot-script-addr-burst", "8")
	codesOf := func(macs func(i int) string, from func(i int) string, n int) (ok, limited int, hdr http.Header, body string) {
		for i := range n {
			code, h, b := c.script(macs(i), from(i))
			switch code {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				if limited == 0 {
					hdr, body = h, b
				}
				limited++
			default:
				t.Fatalf("request %d: %d %s", i, code, b)
			}
		}
		return
	}
	t.Run("one MAC from many addresses", func(t *testing.T) {
		const mac = "52:54:00:cc:00:01"
		ok, limited, hdr, body := codesOf(func(int) string { return mac }, func(i int) string { return fmt.Sprintf("127.0.5.%d", i+1) }, 8)
		if ok != 5 || limited != 3 {
			t.Fatalf("%d served, %d refused; want 5 and 3", ok, limited)
		}
		if hdr.Get("Retry-After") == "" || !strings.Contains(body, "too many boot script requests for MAC "+mac) {
			t.Errorf("refusal: Retry-After %q, body %q", hdr.Get("Retry-After"), body)
		}
		c.waitEntry(mac, "http-refused", "too many boot script requests")
	})
	t.Run("many MACs from one address", func(t *testing.T) {
		ok, limited, hdr, body := codesOf(func(i int) string { return fmt.Sprintf("52:54:00:cc:01:%02x", i) }, func(int) string { return "127.0.6.1" }, 12)
		if ok != 8 || limited != 4 {
			t.Fatalf("%d served, %d refused; want 8 and 4", ok, limited)
		}
		if hdr.Get("Retry-After") == "" || !strings.Contains(body, "source address 127.0.6.1") {
			t.Errorf("refusal: Retry-After %q, body %q", hdr.Get("Retry-After"), body)
		}
		c.waitEntry("52:54:00:cc:01:08", "http-refused", "too many boot script requests")
	})
}

// httpGet sends GET path to addr from the local address from (a loopback
// address, or one of the namespace the calling thread is in) and returns
// the status, headers and body.
func httpGet(t *testing.T, addr, from, path string) (int, http.Header, string) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	defer conn.Close()
	return httpOn(t, conn, addr, path)
}

func httpOn(t *testing.T, conn net.Conn, host, path string) (int, http.Header, string) {
	t.Helper()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestAttackAgentScriptFromWrongAddress: with corrald's DHCP in full mode a
// MAC's script is issued only to the address leased to that MAC. corrald
// runs in a network namespace on a bridge; the attacker, in another joined
// by a veth, takes leases for its own MAC and (spoofing chaddr) the
// victim's, and asks for the victim's script from its own leased address
// and from a static one.
func TestAttackAgentScriptFromWrongAddress(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for the full-mode lease check")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const (
		victim, attacker = "52:54:00:aa:10:01", "52:54:00:bb:10:01"
		static           = "10.78.1.250"
	)
	srvNS, cliNS, br, inner := netnsPair(t, "cra", "10.78.1", static)
	f := startFullCorrald(t, srvNS, br, "10.78.1")
	dhcpConn := dhcpClient(t, cliNS)
	leaseA := dora(t, dhcpConn, attacker)
	leaseV := dora(t, dhcpConn, victim) // chaddr spoofed: the victim's lease exists
	t.Logf("leases: attacker %s, victim %s", leaseA, leaseV)
	ipCmd(t, "-n", cliNS, "addr", "add", leaseA+"/24", "dev", inner)

	getPath := func(path, mac, from string) (int, string) {
		var conn net.Conn
		inNetns(t, cliNS, func() {
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			var err error
			if conn, err = d.Dial("tcp", "10.78.1.1:8080"); err != nil {
				t.Fatalf("dial from %s: %v", from, err)
			}
		})
		defer conn.Close()
		code, _, body := httpOn(t, conn, "10.78.1.1:8080", path+"?mac="+mac)
		return code, body
	}
	get := func(mac, from string) (int, string) { return getPath("/boot.ipxe", mac, from) }
	for name, tc := range map[string]struct {
		mac, from string
		code      int
		want      string
	}{
		"own MAC from own lease":         {attacker, leaseA, 200, "corral.token="},
		"victim's MAC from own lease":    {victim, leaseA, 403, leaseA + " is leased to " + attacker + ", not " + victim},
		"victim's MAC from a static one": {victim, static, 403, static + " holds no DHCP lease"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.code != 200 {
				// arm64 machines' GRUB config carries the same token:
				// the same rule holds for it.
				if code, body := getPath("/boot.grub", tc.mac, tc.from); code != tc.code || !strings.Contains(body, tc.want) {
					t.Fatalf("GRUB config of %s from %s: %d %q; want %d containing %q", tc.mac, tc.from, code, body, tc.code, tc.want)
				}
			}
			code, body := get(tc.mac, tc.from)
			if code != tc.code || !strings.Contains(body, tc.want) {
				t.Fatalf("script of %s from %s: %d %q; want %d containing %q", tc.mac, tc.from, code, body, tc.code, tc.want)
			}
			if code != 200 && strings.Contains(body, "corral.token") {
				t.Fatal("a refused script carries a token")
			}
		})
	}
	// The refusals, two of the script and two of the GRUB config, are on
	// the victim's timeline.
	type entry struct {
		Event      string            `json:"event"`
		Detail     string            `json:"detail"`
		Attributes map[string]string `json:"attributes"`
	}
	var refused []entry
	for deadline := time.Now().Add(10 * time.Second); len(refused) < 4 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := exec.Command("ip", "netns", "exec", srvNS, filepath.Join(binDir, "corral"), "--config", filepath.Join(f.data, "admin.conf"),
			"machine", "timeline", victim, "-o", "json").CombinedOutput()
		if err != nil {
			t.Fatalf("corral machine timeline: %v\n%s", err, out)
		}
		var es []entry
		if err := json.Unmarshal(out, &es); err != nil {
			t.Fatalf("timeline json: %v\n%s", err, out)
		}
		refused = refused[:0]
		for _, e := range es {
			if e.Event == "http-refused" && e.Attributes["status"] == "403" {
				refused = append(refused, e)
			}
		}
	}
	paths := map[string]int{}
	for _, e := range refused {
		paths[e.Attributes["path"]]++
	}
	if len(refused) != 4 || paths["/boot.ipxe"] != 2 || paths["/boot.grub"] != 2 {
		t.Fatalf("%d 403 refusals on the victim's timeline (%v); want 2 of /boot.ipxe and 2 of /boot.grub: %+v", len(refused), paths, refused)
	}
	// The victim, from its own leased address, gets its script.
	ipCmd(t, "-n", cliNS, "addr", "add", leaseV+"/24", "dev", inner)
	if code, body := get(victim, leaseV); code != 200 || !strings.Contains(body, "corral.token=") {
		t.Fatalf("the victim's own script from its lease: %d %s", code, body)
	}
}

// dora takes a lease for mac (DISCOVER, OFFER, REQUEST, ACK) and returns
// the address.
func dora(t *testing.T, c *net.UDPConn, mac string) string {
	t.Helper()
	hw, _ := net.ParseMAC(mac)
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	var offer *dhcpv4.DHCPv4
	for attempt := 0; offer == nil && attempt < 10; attempt++ {
		d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true), pxeClient)
		if err != nil {
			t.Fatal(err)
		}
		offer = dhcpExchange(t, c, d, bcast, dhcpv4.MessageTypeOffer)
	}
	if offer == nil {
		t.Fatalf("no OFFER for %s", mac)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithBroadcast(true), pxeClient)
	if err != nil {
		t.Fatal(err)
	}
	ack := dhcpExchange(t, c, req, bcast, dhcpv4.MessageTypeAck)
	if ack == nil {
		t.Fatalf("no ACK for %s", mac)
	}
	return ack.YourIPAddr.String()
}

// pxeClient marks a DHCP packet as a PXE firmware's (BIOS x86): only
// network-booting clients become machines.
func pxeClient(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))
}

// dhcpExchange sends m and returns the first reply of type want with m's
// transaction id, or nil after 2 s.
func dhcpExchange(t *testing.T, c *net.UDPConn, m *dhcpv4.DHCPv4, dst *net.UDPAddr, want dhcpv4.MessageType) *dhcpv4.DHCPv4 {
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
		r, err := dhcpv4.FromBytes(buf[:n])
		if err == nil && r.TransactionID == m.TransactionID && r.OpCode == dhcpv4.OpcodeBootReply && r.MessageType() == want {
			return r
		}
	}
}

// inNetns runs fn on an OS thread switched into the named network
// namespace, so that the sockets fn opens live there.
func inNetns(t *testing.T, name string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(name)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer func() {
		// A thread that cannot go back stays locked and dies with the
		// goroutine.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	fn()
}

// netnsPair makes two network namespaces of the test's own, a server side
// with a bridge at <subnet>.1/24 and a client side joined to it by a veth
// with address client/24 and its default route through the bridge, and
// deletes them at the end. It returns their names, the bridge's and the
// client's interface.
func netnsPair(t *testing.T, prefix, subnet, client string) (srvNS, cliNS, br, inner string) {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)
	srvNS, cliNS = prefix+id, prefix+id+"c"
	br, inner = "b"+prefix[2:]+id[:4], "e"+prefix[2:]+id[:4]
	host := "v" + prefix[2:] + id[:4]
	ipc := func(args ...string) { t.Helper(); ipCmd(t, args...) }
	ipc("netns", "add", srvNS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", srvNS).Run() })
	ipc("netns", "add", cliNS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", cliNS).Run() })
	ipc("-n", srvNS, "link", "set", "lo", "up")
	ipc("-n", srvNS, "link", "add", br, "type", "bridge")
	ipc("-n", srvNS, "addr", "add", subnet+".1/24", "dev", br)
	ipc("-n", srvNS, "link", "set", br, "up")
	ipc("-n", srvNS, "link", "add", host, "type", "veth", "peer", "name", inner, "netns", cliNS)
	ipc("-n", srvNS, "link", "set", host, "master", br)
	ipc("-n", srvNS, "link", "set", host, "up")
	ipc("-n", cliNS, "link", "set", "lo", "up")
	ipc("-n", cliNS, "addr", "add", client+"/24", "dev", inner)
	ipc("-n", cliNS, "link", "set", inner, "up")
	ipc("-n", cliNS, "route", "add", "default", "via", subnet+".1")
	return srvNS, cliNS, br, inner
}

// ipCmd runs ip(8) with args and fails the test if it fails.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
