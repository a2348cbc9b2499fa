package cli

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/appliance"

	"github.com/corralhq/corral/ipmi/seal"
	apptest "github.com/corralhq/corral/testsupport/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// syncBuffer is a buffer safe for concurrent writers and the test.
type syncBuffer = syncbuf.Buffer

// bmcApp is a running appliance and a way to run the corral CLI at it.
type bmcApp struct {
	srv     *appliance.Server
	dataDir string
	conf    string
	log     *syncBuffer
}

func startBMCApp(t *testing.T, cfg appliance.Config) *bmcApp {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("corrald log:\n%s", logs.String())
		}
	})
	a := apptest.Start(t, cfg)
	return &bmcApp{srv: a.Server, dataDir: a.DataDir, conf: a.AdminConf, log: logs}
}

type cliResult struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (a *bmcApp) corral(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	start := time.Now()
	code := Run(context.Background(), append([]string{"--config", a.conf}, args...), &out, &errb)
	r := cliResult{code: code, stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	t.Logf("corral %s -> %d (%s)\n%s%s", strings.Join(args, " "), code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
	return r
}

func (a *bmcApp) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := a.corral(t, args...)
	if r.code != 0 {
		t.Fatalf("corral %v: exit %d: %s", args, r.code, r.stderr)
	}
	return r.stdout
}

func eventually(t *testing.T, within time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if f() {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("not within %s: %s", within, what)
}

func writePassword(t *testing.T, pw string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(p, []byte(pw+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func countIn(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// TestBMCRealVM drives a QEMU machine (TCG) through ipmi_sim (over
// ipmi-bmc-extern) and through the in-repo Redfish server, with the corral
// CLI against a real corrald.
func TestBMCRealVM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim and QEMU")
	}
	require.Tool(t, "ipmi_sim", "qemu-system-x86_64")
	const mac = "52:54:00:c0:ff:01"
	b := ipmisim.Start(t, ipmisim.Options{VM: true, MAC: mac, Password: "s3cret-ipmi"})
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: 500 * time.Millisecond}})
	pw := writePassword(t, b.Pass, 0o600)

	// Enroll: verified against the BMC, then stored.
	out := app.ok(t, "machine", "enroll", "vm1", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", pw, "--bmc-protocol", "ipmi", "--mac", mac)
	if !strings.Contains(out, "vm1") || !strings.Contains(out, "OFF") {
		t.Fatalf("enroll output: %s", out)
	}

	// power on starts the QEMU process.
	app.ok(t, "machine", "power", "on", "vm1")
	eventually(t, 10*time.Second, "QEMU running after power on", b.Running)
	if out := app.ok(t, "machine", "power", "status", "vm1"); !strings.Contains(out, "power ON (via native-ipmi)") {
		t.Fatalf("status: %s", out)
	}
	// on when on: success, the VM untouched.
	if out := app.ok(t, "machine", "power", "on", "vm1"); !strings.Contains(out, "already on") {
		t.Fatalf("on when on: %s", out)
	}

	// bootdev pxe + power cycle: the machine boots from the network.
	app.ok(t, "machine", "bootdev", "pxe", "vm1")
	app.ok(t, "machine", "power", "cycle", "vm1")
	eventually(t, 15*time.Second, "QEMU restarted with PXE first", func() bool {
		return countIn(b.Record(), "start boot=pxe") == 1 && b.Running() && strings.Contains(b.QEMUArgs(), "-boot order=n")
	})
	eventually(t, 90*time.Second, "the VM's firmware boots its NIC ROM and sends DHCP DISCOVER", func() bool {
		return strings.Contains(b.Firmware(), "Booting from ROM") && b.DHCPDiscovers() > 0
	})
	t.Logf("PXE: firmware booted the NIC ROM; %d DHCP DISCOVER(s) captured on the VM's NIC", b.DHCPDiscovers())

	// power off stops it.
	app.ok(t, "machine", "power", "off", "vm1")
	eventually(t, 10*time.Second, "QEMU stopped after power off", func() bool { return !b.Running() })

	// The poller notices a change made behind corrald's back and records it.
	if err := b.Machine().Reset("On"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "poller recorded power on", func() bool {
		return strings.Contains(app.ok(t, "machine", "timeline", "vm1"), "power off -> on")
	})
	if err := b.Machine().Reset("ForceOff"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "poller recorded power off", func() bool {
		return strings.Contains(app.ok(t, "get", "machines"), "OFF ")
	})
	tl := app.ok(t, "machine", "timeline", "vm1")
	for _, want := range []string{"enrolled", "power-on", "bootdev", "power-cycle", "power-off", "power-changed"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %s", want)
		}
	}

	// The same operations through Redfish (the in-repo test server) on the
	// same VM.
	rf := redfishtest.Start(t, "root", "calvin-rf", b.Machine())
	rfpw := writePassword(t, rf.Pass, 0o600)
	app.ok(t, "machine", "enroll", "vm1-rf", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", rfpw, "--bmc-protocol", "redfish")
	app.ok(t, "machine", "power", "on", "vm1-rf")
	eventually(t, 10*time.Second, "QEMU running after Redfish power on", b.Running)
	if out := app.ok(t, "machine", "power", "status", "vm1-rf"); !strings.Contains(out, "power ON (via gofish)") {
		t.Fatalf("redfish status: %s", out)
	}
	app.ok(t, "machine", "bootdev", "pxe", "vm1-rf", "--efi")
	app.ok(t, "machine", "power", "cycle", "vm1-rf")
	eventually(t, 15*time.Second, "QEMU restarted with PXE first via Redfish", func() bool {
		return countIn(b.Record(), "start boot=pxe") == 2 && b.Running() && strings.Contains(b.QEMUArgs(), "-boot order=n")
	})
	eventually(t, 90*time.Second, "DHCP DISCOVER after the Redfish PXE boot", func() bool { return b.DHCPDiscovers() > 0 })
	app.ok(t, "machine", "power", "off", "vm1-rf")
	eventually(t, 10*time.Second, "QEMU stopped after Redfish power off", func() bool { return !b.Running() })

	// get machines: power with its age.
	if out := app.ok(t, "get", "machines"); !strings.Contains(out, "POWER") || !strings.Contains(out, "OFF ") {
		t.Fatalf("get machines: %s", out)
	}
	// Passwords are never returned or logged.
	js := app.ok(t, "get", "machine", "vm1", "-o", "json") + app.ok(t, "get", "machine", "vm1-rf", "-o", "json")
	for _, secret := range []string{b.Pass, rf.Pass} {
		if strings.Contains(js, secret) || strings.Contains(app.log.String(), secret) {
			t.Fatalf("password %q visible in API output or logs", secret)
		}
	}
}

// TestBMCEnrollRefusals: wrong password, unreachable BMC, duplicate
// address, bad input, through the CLI against a real corrald and ipmi_sim.
func TestBMCEnrollRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim")
	}
	b := ipmisim.Start(t, ipmisim.Options{})
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1}})
	pw := writePassword(t, b.Pass, 0o600)
	app.ok(t, "machine", "enroll", "m1", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", pw)

	// Wrong password: refused within 5 s, saying authentication failed.
	bad := writePassword(t, "not-the-password", 0o600)
	b2 := ipmisim.Start(t, ipmisim.Options{})
	r := app.corral(t, "machine", "enroll", "m2", "--bmc", b2.Addr(), "--bmc-user", b2.User, "--bmc-password-file", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "authentication failed") || r.took > 5*time.Second {
		t.Fatalf("wrong password: exit %d after %s: %s", r.code, r.took, r.stderr)
	}

	// Unreachable: an error at the deadline, not later.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	r = app.corral(t, "machine", "enroll", "m3", "--bmc", pc.LocalAddr().String(), "--bmc-user", "admin", "--bmc-password-file", pw,
		"--bmc-protocol", "ipmi", "--bmc-timeout", "2s")
	if r.code != 1 || !strings.Contains(r.stderr, "unreachable") || r.took > 3*time.Second || r.took < 1900*time.Millisecond {
		t.Fatalf("unreachable: exit %d after %s: %s", r.code, r.took, r.stderr)
	}

	// The same BMC address on a second machine is refused.
	r = app.corral(t, "machine", "enroll", "m4", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", pw)
	if r.code != 1 || !strings.Contains(r.stderr, `already enrolled on machine "m1"`) || !strings.Contains(r.stderr, "AlreadyExists") {
		t.Fatalf("duplicate: exit %d: %s", r.code, r.stderr)
	}
	// Malformed addresses and bad protocols never reach a BMC.
	for _, addr := range []string{"http://10.0.0.1/", "10.0.0.1:99999", "not a host", "999.1.1.1", "[fe80::1"} {
		r = app.corral(t, "machine", "enroll", "m5", "--bmc", addr, "--bmc-user", "u", "--bmc-password-file", pw)
		if r.code != 1 || !strings.Contains(r.stderr, "InvalidArgument") {
			t.Fatalf("address %q: exit %d: %s", addr, r.code, r.stderr)
		}
	}
	if r = app.corral(t, "machine", "enroll", "m5", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", pw, "--bmc-protocol", "snmp"); r.code != 2 {
		t.Fatalf("bad protocol: exit %d: %s", r.code, r.stderr)
	}
	// World-readable password file: a warning, and the enroll still runs.
	loose := writePassword(t, b2.Pass, 0o644)
	r = app.corral(t, "machine", "enroll", "m2", "--bmc", b2.Addr(), "--bmc-user", b2.User, "--bmc-password-file", loose)
	if r.code != 0 || !strings.Contains(r.stderr, "world-readable") {
		t.Fatalf("world-readable: exit %d: %s", r.code, r.stderr)
	}
	// Nothing was created by the refused enrolments.
	out := app.ok(t, "get", "machines")
	for _, m := range []string{"m3", "m4", "m5"} {
		if strings.Contains(out, m+" ") {
			t.Fatalf("%s created by a refused enroll:\n%s", m, out)
		}
	}
	// The seal key exists, owner-only.
	fi, err := os.Stat(filepath.Join(app.dataDir, seal.KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seal key: %v %v", fi, err)
	}
}

// labBridge makes a Linux bridge with an address and a tap on it for a VM
// NIC, named uniquely for this run, removed when the test ends.
func labBridge(t *testing.T) (bridge, tap, serverIP string, subnet string) {
	t.Helper()
	require.Root(t, "a bridge and a tap")
	require.Tool(t, "ip")
	var rb [4]byte
	_, _ = crand.Read(rb[:])
	id := hex.EncodeToString(rb[:3])
	bridge, tap = "crb"+id, "crt"+id
	subnet = fmt.Sprintf("10.%d.%d", 100+int(rb[0])%100, rb[1])
	serverIP = subnet + ".1"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	run("tuntap", "add", "dev", tap, "mode", "tap")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	run("link", "set", tap, "master", bridge)
	run("addr", "add", serverIP+"/24", "dev", bridge)
	run("link", "set", tap, "up")
	run("link", "set", bridge, "up")
	return bridge, tap, serverIP, subnet
}

// TestBMCPXEThroughCorrald: enroll, bootdev pxe and power on through
// corrald make the VM PXE-boot from corrald's own DHCP server, seen in the
// machine's boot timeline.
func TestBMCPXEThroughCorrald(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim and QEMU on a bridge")
	}
	require.Tool(t, "ipmi_sim", "qemu-system-x86_64")
	bridge, tap, serverIP, subnet := labBridge(t)
	const mac = "52:54:00:c0:ff:02"
	b := ipmisim.Start(t, ipmisim.Options{VM: true, MAC: mac, NetDev: "tap,id=n0,ifname=" + tap + ",script=no,downscript=no"})
	app := startBMCApp(t, appliance.Config{
		// On the boot interface's address: corrald refuses a loopback-only
		// API that booting machines could not reach.
		APIListen: serverIP + ":0",
		BMC:       appliance.BMCConfig{PollInterval: -1},
		Boot: appliance.BootConfig{Interface: bridge, DHCPMode: "full", DHCPRange: subnet + ".100-" + subnet + ".150",
			HTTPListen: fmt.Sprintf("%s:%d", serverIP, ipmisim.FreeTCPPort(t)), TFTPListen: "off", NoRA: true},
	})
	pw := writePassword(t, b.Pass, 0o600)
	app.ok(t, "machine", "enroll", "pxe1", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", pw, "--bmc-protocol", "ipmi", "--mac", mac)
	app.ok(t, "machine", "bootdev", "pxe", "pxe1")
	app.ok(t, "machine", "power", "on", "pxe1")
	eventually(t, 120*time.Second, "corrald's DHCP server saw the VM's DISCOVER (boot timeline)", func() bool {
		tl := app.ok(t, "machine", "timeline", "pxe1")
		return strings.Contains(tl, "dhcp") && strings.Contains(tl, "discover")
	})
	tl := app.ok(t, "machine", "timeline", "pxe1")
	if !strings.Contains(tl, "offer") {
		t.Logf("no OFFER yet in the timeline:\n%s", tl)
	}
	app.ok(t, "machine", "power", "off", "pxe1")
	eventually(t, 10*time.Second, "QEMU stopped", func() bool { return !b.Running() })
}
