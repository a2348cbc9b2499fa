package main

// Attack tests for terminal escapes and report caps, against the built
// corrald and corral (docs/security.md, "Control characters" and "Report
// caps"): strings from the boot LAN carrying terminal control sequences
// (an agent's facts, a boot HTTP path, a TFTP file name, DHCP options 60
// and 77, an unauthenticated call's object name) never reach the
// operator's terminal raw through `corral get machines`, `corral machine
// timeline` or `corral get events`; an oversized report is refused with
// InvalidArgument naming the cap and its flag, and the machine's record is
// unchanged.

import (
	"context"
	"encoding/binary"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/corralhq/corral/testsupport/require"
)

// Terminal control sequences an attacker would send: window title (OSC 0),
// clear screen (CSI 2J), a clipboard write (OSC 52), a hyperlink (OSC 8),
// CSI in its C1 form and a right-to-left override.
const (
	escTitle     = "\x1b]0;owned\x07"
	escClear     = "\x1b[2J"
	escClipboard = "\x1b]52;c;Y3VybCBldmlsfHNo\x07"
	escLink      = "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
	escC1        = "\u009b31m"
	escBidi      = "\u202egnp.exe"
)

// assertNoRaw fails if out holds an ESC, BEL, C1 or bidi override byte
// sequence.
func assertNoRaw(t *testing.T, what, out string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u009d", "\x9b", "\u202e", "\u2066"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s holds %q raw:\n%q", what, bad, out)
		}
	}
}

func TestAttackTerminalEscapesAndReportCaps(t *testing.T) {
	tftpAddr, metrics := freePort(t), freePort(t)
	c := startCredCorrald(t, "--tftp-listen", tftpAddr, "--metrics-listen", metrics)
	ctx := context.Background()
	const mac, from = "52:54:00:cc:00:01", "127.0.3.1"
	conf := filepath.Join(t.TempDir(), "admin.conf")
	if err := c.cc.Write(conf); err != nil {
		t.Fatal(err)
	}
	corral := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "corral"), append([]string{"--config", conf}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	tok := c.token(mac, from)
	agent := c.agent(tok)
	good := machinefacts.QEMU("SN-ESC-1", "", mac)
	reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: good})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	name := reg.GetMachineName()
	before := c.machine(name)

	t.Run("reports refused, the record unchanged", func(t *testing.T) {
		evil := machinefacts.QEMU("SN-ESC-1", "", mac)
		evil.System.Vendor = "QEMU" + escTitle + escClear
		big := machinefacts.QEMU("SN-ESC-1", "", mac)
		for i := range 400 {
			big.PciDevices = append(big.PciDevices, &inventoryv1.Facts_PciDevice{Address: "0000:00:00." + string(rune('0'+i%8)), Product: strings.Repeat("p", 500), Vendor: strings.Repeat("v", 500)})
		}
		disks := machinefacts.QEMU("SN-ESC-1", "", mac)
		for range 300 {
			disks.Disks = append(disks.Disks, &inventoryv1.Facts_Disk{Name: "sdx"})
		}
		for what, tc := range map[string]struct {
			f    *inventoryv1.Facts
			says []string
		}{
			"control characters": {evil, []string{"facts.system.vendor", `\x1b]0;owned\x07`}},
			"over 256 KiB":       {big, []string{"over the 262144-byte cap", "--max-report-bytes"}},
			"over 256 disks":     {disks, []string{"disks", "cap of 256", "--max-report-disks"}},
		} {
			_, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: tc.f})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument {
				t.Errorf("%s: Register = %v; want InvalidArgument", what, err)
				continue
			}
			for _, s := range tc.says {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("%s: %q does not say %q", what, st.Message(), s)
				}
			}
			assertNoRaw(t, what+" refusal", st.Message())
		}
		if diff := cmp.Diff(before, c.machine(name), protocmp.Transform()); diff != "" {
			t.Errorf("the machine's record changed (-before +after):\n%s", diff)
		}
		// Each refusal is counted by its reason, and logged.
		for _, reason := range []string{"control", "report_bytes", "disks"} {
			if got := metricValue(t, metrics, `corral_report_refusals_total{reason="`+reason+`"}`); got != 1 {
				t.Errorf("corral_report_refusals_total{reason=%q} = %v, want 1", reason, got)
			}
		}
		if n := strings.Count(c.logs.String(), `msg="report refused"`); n != 3 {
			t.Errorf("%d report refusals logged, want 3", n)
		}
	})

	// A boot HTTP path and a TFTP file name with control sequences (the
	// path percent-encoded, as a client sends it; decoded it is raw).
	code, _, _ := httpGet(t, c.http, from, "/images/"+url.PathEscape("x"+escTitle+escClipboard+escLink)+"?mac="+mac)
	if code != 404 {
		t.Errorf("GET of an escape-laden path: %d, want 404", code)
	}
	tftpRead(t, tftpAddr, "pxe"+escClear+escC1+escBidi+".efi")
	// An unauthenticated call naming an escape-laden machine.
	_, err = inventoryv1.NewMachineServiceClient(c.dial("")).DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "m" + escTitle + escBidi})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("DeleteMachine without a token: %v; want Unauthenticated", err)
	}
	c.waitEntry(mac, "http-refused", "is not in the image catalog")

	for _, args := range [][]string{
		{"get", "machines"}, {"get", "machines", "-o", "wide"}, {"get", "machines", "-o", "yaml"},
		{"machine", "timeline", name}, {"machine", "timeline", name, "-o", "json"},
		{"get", "events"}, {"get", "events", "-o", "wide"}, {"describe", "machine", name},
	} {
		out := corral(args...)
		assertNoRaw(t, "corral "+strings.Join(args, " "), out)
		if args[0] == "machine" && args[len(args)-1] == name && !strings.Contains(out, `\x1b]0;owned\x07`) {
			t.Errorf("the timeline does not show the escaped path:\n%s", out)
		}
	}
	events := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if events = corral("get", "events"); strings.Contains(events, "Unauthenticated") {
			break
		}
	}
	assertNoRaw(t, "corral get events", events)
	if !strings.Contains(events, `\x1b]0;owned\x07`) {
		t.Errorf("get events does not show the unauthenticated call's escaped object:\n%s", events)
	}
	assertNoRaw(t, "corrald's log", c.logs.String())
	if !strings.Contains(c.logs.String(), `\x1b[2J`) {
		t.Errorf("corrald's log does not show the escaped TFTP name")
	}
}

// tftpRead sends a TFTP read request for name to addr and waits briefly for
// the answer (an error packet: no such file).
func tftpRead(t *testing.T, addr, name string) {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pkt := binary.BigEndian.AppendUint16(nil, 1)
	pkt = append(append(append(append(pkt, name...), 0), "octet"...), 0)
	if _, err := conn.Write(pkt); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 1500)
	conn.Read(buf)
}

// TestAttackDHCPOptionsEscaped: DHCP options 60 (vendor class) and 77
// (user class) and a host name carrying control sequences, from a client
// in another network namespace, reach `corral machine timeline` and `corral
// get machines` escaped. corrald runs with DHCP in full mode on a bridge in
// its own namespace, TFTP on.
func TestAttackDHCPOptionsEscaped(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for DHCP in full mode")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const mac = "52:54:00:cc:01:01"
	// The client side has an address: a route for the broadcast.
	srvNS, cliNS, br, inner := netnsPair(t, "cre", "10.79.1", "10.79.1.250")
	f := startFullCorrald(t, srvNS, br, "10.79.1", "--tftp-listen", "10.79.1.1:69")
	corral := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", srvNS, filepath.Join(binDir, "corral"), "--config", filepath.Join(f.data, "admin.conf")}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	conn := dhcpClient(t, cliNS)
	hw, _ := net.ParseMAC(mac)
	evil := func(d *dhcpv4.DHCPv4) {
		d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001" + escTitle + escClipboard))
		d.UpdateOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))
		d.UpdateOption(dhcpv4.OptUserClass("iPXE" + escClear + escLink + escC1 + escBidi))
		d.UpdateOption(dhcpv4.OptHostName("host" + escTitle))
	}
	var offer *dhcpv4.DHCPv4
	for attempt := 0; offer == nil && attempt < 10; attempt++ {
		d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true), evil)
		if err != nil {
			t.Fatal(err)
		}
		offer = dhcpExchange(t, conn, d, &net.UDPAddr{IP: net.IPv4bcast, Port: 67}, dhcpv4.MessageTypeOffer)
	}
	if offer == nil {
		t.Fatal("no OFFER")
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithBroadcast(true), evil)
	if err != nil {
		t.Fatal(err)
	}
	ack := dhcpExchange(t, conn, req, &net.UDPAddr{IP: net.IPv4bcast, Port: 67}, dhcpv4.MessageTypeAck)
	if ack == nil {
		t.Fatal("no ACK")
	}
	lease := ack.YourIPAddr.String()
	ipCmd(t, "-n", cliNS, "addr", "add", lease+"/24", "dev", inner)
	// A TFTP name from the leased address: the MAC is known, so it goes
	// on the timeline too.
	inNetns(t, cliNS, func() { tftpRead(t, "10.79.1.1:69", "boot"+escClear+escBidi+".efi") })

	var tl string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if tl = corral("machine", "timeline", mac, "-o", "json"); strings.Contains(tl, "tftp-refused") && strings.Contains(tl, "vendor_class") {
			break
		}
	}
	table := corral("machine", "timeline", mac)
	for _, want := range []string{`\x1b]0;owned\x07`, `\x1b]52;c;`, `\x1b[2J`, `\u202e`} {
		if !strings.Contains(table, want) {
			t.Errorf("the timeline does not show %q escaped:\n%s\n%s", want, table, tl)
		}
	}
	assertNoRaw(t, "corral machine timeline -o json", tl)
	for _, args := range [][]string{
		{"machine", "timeline", mac}, {"machine", "timeline", mac, "-o", "yaml"},
		{"get", "machines"}, {"get", "machines", "-o", "wide"}, {"get", "events"},
	} {
		assertNoRaw(t, "corral "+strings.Join(args, " "), corral(args...))
	}
	assertNoRaw(t, "corrald's log", f.logs.String())
}
