package cli

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/appliance"
	apptest "github.com/corralhq/corral/testsupport/appliance"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestConsoleRedfishSSHThroughCorrald: a machine whose BMC is Redfish
// (the in-repo test server: SerialConsole on its ComputerSystem and a
// real SSH server bridging to a console emulator). Through a real
// corrald and `corral machine console`: a BMC reporting its console
// disabled is said so; once enabled (shared with its CLI, an entry
// command) the login prompt arrives and typed keys reach the console;
// the SSH host key is pinned on first use and shown by describe. Then
// the attack: the BMC presents another host key — the link is refused
// with both fingerprints and the SSH server sees no password, the pin
// stays, a new attach is refused naming forget-hostkey; forget-hostkey
// (audited) clears it and the next link pins the new key.
func TestConsoleRedfishSSHThroughCorrald(t *testing.T) {
	logs := &syncBuffer{}
	a := apptest.Start(t, appliance.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		BMC: appliance.BMCConfig{PollInterval: -1, HealthInterval: -1}})
	rf := redfishtest.Start(t, "root", "calvin-rf", &redfishtest.MemMachine{})
	rf.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: false})
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte(rf.Pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &consoleRig{conf: a.AdminConf, log: logs}
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errb syncBuffer
		code := Run(context.Background(), append([]string{"--config", r.conf}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cli("machine", "enroll", "m1", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", pw, "--bmc-protocol", "redfish", "--mac", "52:54:00:c0:ff:21"); code != 0 {
		t.Fatalf("enroll: %d %s %s", code, out, errs)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("corrald log:\n%s", logs.String())
		}
	})

	c := r.console(t)
	waitText(t, "attached", 20*time.Second, c.err.String, "attached to m1's console, write")
	waitText(t, "disabled said", 20*time.Second, c.err.String, "SerialConsole.SSH.ServiceEnabled is false")
	if n := rf.Console.PasswordAttempts(); n != 0 {
		t.Fatalf("a disabled console was logged into (%d attempts)", n)
	}

	// Enabled, shared with the BMC's CLI: the link (retried every 2 s)
	// types the entry command and reaches the console.
	rf.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: true, EntryCommand: "console 1", HotKey: "ESC ("})
	waitText(t, "console output", 20*time.Second, c.out.String, "Corral test machine ttyS0")
	waitText(t, "login prompt", 5*time.Second, c.out.String, "login: ")
	if _, err := c.in.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	waitText(t, "keys at the console", 10*time.Second, rf.Console.Received, "root\r")
	waitText(t, "echo", 10*time.Second, c.out.String, "login: root")
	rf.Console.Print([]byte("machine says hello\r\n"))
	waitText(t, "machine output", 10*time.Second, c.out.String, "machine says hello")
	first := rf.Console.HostKey()
	_, desc, _ := cli("describe", "machine", "m1")
	if !strings.Contains(desc, "consoleHostKey: "+first) && !strings.Contains(desc, "console_host_key: "+first) || !strings.Contains(desc, "# bmc console host key: pinned "+first) {
		t.Fatalf("describe lacks the pinned host key %s:\n%s", first, desc)
	}

	// The attack: another host key at the BMC's address. The link drops
	// and is opened again; the key exchange refuses it before any
	// password.
	attempts := rf.Console.PasswordAttempts()
	if err := rf.Console.RotateHostKey(); err != nil {
		t.Fatal(err)
	}
	impostor := rf.Console.HostKey()
	rf.Console.DropSessions()
	waitText(t, "refusal to the viewer", 20*time.Second, c.err.String, "presented SSH host key "+impostor+", not the pinned "+first)
	if n := rf.Console.PasswordAttempts(); n != attempts {
		t.Fatalf("the SSH server with another host key saw %d password attempts", n-attempts)
	}
	_, desc, _ = cli("describe", "machine", "m1")
	_, js, _ := cli("get", "machine", "m1", "-o", "json")
	if !strings.Contains(desc, "# bmc console host key: pinned "+first) || !strings.Contains(js, "bmc-console-host-key-changed: pinned "+first+", presented "+impostor) {
		t.Fatalf("after the refusal the pin must stay and the machine be flagged:\n%s\n%s", desc, js)
	}
	code, _, errs := cli("machine", "console", "m1", "--read-only")
	if code == 0 || !strings.Contains(errs, "forget-hostkey m1") || !strings.Contains(errs, impostor) || !strings.Contains(errs, first) {
		t.Fatalf("attach while the key is refused: exit %d %q", code, errs)
	}
	if code, _, errs := cli("machine", "bmc", "forget-hostkey", "m1", "--expect", impostor); code == 0 || !strings.Contains(errs, "nothing changed") {
		t.Fatalf("forget-hostkey --expect another key: exit %d %q", code, errs)
	}
	if code, out, errs := cli("machine", "bmc", "forget-hostkey", "m1", "--expect", first); code != 0 || !strings.Contains(out, "console host key "+first+" forgotten") {
		t.Fatalf("forget-hostkey: exit %d %q %q", code, out, errs)
	}
	// The viewer still attached: the next link pins the new key.
	before := len(c.out.String())
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(c.out.String()[before:], "Corral test machine ttyS0") {
		if time.Now().After(deadline) {
			t.Fatalf("no console after forget-hostkey; stderr %q", c.err.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, desc, _ = cli("describe", "machine", "m1")
	if !strings.Contains(desc, "# bmc console host key: pinned "+impostor) || strings.Contains(desc, "bmc-console-host-key-changed") {
		t.Fatalf("after forget-hostkey the next link pins the key presented:\n%s", desc)
	}
	_, tl, _ := cli("machine", "timeline", "m1")
	for _, want := range []string{"console-host-key-pinned", "bmc-console-host-key-changed", "console-host-key-forgotten"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %s:\n%s", want, tl)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, ev, _ := cli("get", "events", "-o", "json")
		if strings.Contains(ev, "forget BMC console host key") && strings.Contains(ev, "console attach write") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit lacks forget-hostkey or the attach:\n%s", ev)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if strings.Contains(logs.String(), rf.Pass) {
		t.Fatal("the BMC password is in corrald's log")
	}
}

// BenchmarkConsoleKeystrokeRoundTripRedfishSSH: one key typed into
// `corral machine console`, through corrald and SSH to the Redfish test
// server's console emulator, which echoes it back to the console's
// output; the median of 50 keys is reported, not asserted.
func BenchmarkConsoleKeystrokeRoundTripRedfishSSH(b *testing.B) {
	a := apptest.Start(b, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1, HealthInterval: -1}})
	rf := redfishtest.Start(b, "root", "calvin-rf", &redfishtest.MemMachine{})
	pw := filepath.Join(b.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte(rf.Pass+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	r := &consoleRig{conf: a.AdminConf, log: &syncBuffer{}}
	var out, errb syncBuffer
	if code := Run(context.Background(), []string{"--config", r.conf, "machine", "enroll", "m1", "--bmc", rf.Addr(), "--bmc-user", rf.User,
		"--bmc-password-file", pw, "--bmc-protocol", "redfish"}, &out, &errb); code != 0 {
		b.Fatalf("enroll: %s", errb.String())
	}
	c := r.console(b)
	waitText(b, "login prompt", 20*time.Second, c.out.String, "login: ")
	const keys = 50
	var took []time.Duration
	for range b.N {
		took = took[:0]
		for i := range keys {
			key := string(rune('a' + i%26))
			before := len(c.out.String())
			start := time.Now()
			if _, err := c.in.Write([]byte(key)); err != nil {
				b.Fatal(err)
			}
			for !strings.Contains(c.out.String()[before:], key) {
				if time.Since(start) > 10*time.Second {
					b.Fatalf("key %q never came back", key)
				}
				time.Sleep(100 * time.Microsecond)
			}
			took = append(took, time.Since(start))
		}
	}
	slices.Sort(took)
	med := took[len(took)/2]
	b.ReportMetric(float64(med.Microseconds())/1000, "ms/key-median")
	b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "ms/key-p90")
	b.Logf("Redfish SSH console keystroke round trip over %d keys: median %s, p90 %s, max %s", keys, med, took[len(took)*9/10], took[len(took)-1])
}
