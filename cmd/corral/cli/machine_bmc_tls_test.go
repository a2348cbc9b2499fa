package cli

import (
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

const redfishSessionPost = "POST /redfish/v1/SessionService/Sessions"

// TestBMCRedfishCertificate drives Redfish certificate pinning with the
// corral CLI against a real corrald and a real HTTPS Redfish server with
// a self-signed certificate of its own: enroll pins it (describe shows
// it), a changed certificate fails power status, power and bootdev with
// the way out and never gets the password, the poller flags it,
// re-enrolling with the new pin accepts it.
func TestBMCRedfishCertificate(t *testing.T) {
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: 300 * time.Millisecond}})
	m := &redfishtest.MemMachine{}
	rf := redfishtest.Start(t, "root", "calvin-rf", m)
	pw := writePassword(t, rf.Pass, 0o600)
	enroll := []string{"machine", "enroll", "rf1", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", pw, "--bmc-protocol", "redfish",
		"--mac", "52:54:00:c0:ff:10"}

	// Trust on first use: the certificate presented at enroll is pinned.
	oldFP := rf.Fingerprint()
	app.ok(t, enroll...)
	desc := app.ok(t, "describe", "machine", "rf1")
	if !strings.Contains(desc, "tls_sha256: "+oldFP) || !strings.Contains(desc, "# bmc certificate: pinned sha256 "+oldFP+"\n") {
		t.Fatalf("describe after enroll:\n%s", desc)
	}
	if out := app.ok(t, "machine", "power", "status", "rf1"); !strings.Contains(out, "power OFF (via gofish)") {
		t.Fatalf("status: %s", out)
	}

	// The BMC's certificate changes (a replaced BMC, or someone between
	// corrald and it): every call fails with the way out, and nothing —
	// no password — reaches the server.
	if err := rf.RotateCertificate(); err != nil {
		t.Fatal(err)
	}
	newFP := rf.Fingerprint()
	want := "BMC certificate changed: pinned sha256 " + oldFP + ", presented " + newFP + "; re-enroll with --bmc-tls-sha256 " + newFP + " if this is expected"
	// The poller notices first and flags the machine (once).
	eventually(t, 10*time.Second, "the poller flags the changed certificate", func() bool {
		return strings.Contains(app.ok(t, "get", "machine", "rf1", "-o", "json"), "bmc-certificate-changed: pinned sha256 "+oldFP+", presented "+newFP)
	})
	// Counted from here: a poll already under way on a connection made
	// before the rotation (the old certificate's) may still reach the
	// server until the poller has seen the new one.
	sessions := rf.Requested(redfishSessionPost)
	requests := len(rf.Requests())
	for _, args := range [][]string{
		{"machine", "power", "status", "rf1"},
		{"machine", "power", "on", "rf1"},
		{"machine", "bootdev", "pxe", "rf1"},
	} {
		r := app.corral(t, args...)
		if r.code != ExitError || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "FailedPrecondition") {
			t.Fatalf("%v with a changed certificate: exit %d: %s", args, r.code, r.stderr)
		}
	}
	if on, _ := m.Power(); on || rf.Requested(redfishSessionPost) != sessions || len(rf.Requests()) != requests {
		t.Fatalf("a BMC with a changed certificate was acted on (on=%t) or sent requests: %v", on, rf.Requests()[requests:])
	}
	// Enrolling again without the new pin keeps the old one: refused.
	r := app.corral(t, enroll...)
	if r.code != ExitError || !strings.Contains(r.stderr, want) {
		t.Fatalf("re-enroll without the new pin: exit %d: %s", r.code, r.stderr)
	}
	// With it: accepted, and everything works again.
	app.ok(t, append(enroll, "--bmc-tls-sha256", strings.ToUpper(newFP))...)
	desc = app.ok(t, "describe", "machine", "rf1")
	if !strings.Contains(desc, "# bmc certificate: pinned sha256 "+newFP+"\n") || strings.Contains(desc, "bmc-certificate-changed") {
		t.Fatalf("describe after re-enroll:\n%s", desc)
	}
	app.ok(t, "machine", "power", "on", "rf1")
	if on, _ := m.Power(); !on {
		t.Fatal("power on with the new pin did not reach the machine")
	}
	tl := app.ok(t, "machine", "timeline", "rf1")
	for _, w := range []string{"pinned (trust on first use)", "bmc-certificate-changed", "pinned as given"} {
		if !strings.Contains(tl, w) {
			t.Errorf("timeline lacks %q:\n%s", w, tl)
		}
	}
	if n := strings.Count(tl, "bmc-certificate-changed"); n != 1 {
		t.Errorf("%d bmc-certificate-changed entries (the poller ran many times), want 1:\n%s", n, tl)
	}
}

// TestBMCRedfishInsecure: --bmc-insecure enrolls without a pin, describe
// says so, and a changed certificate is not refused.
func TestBMCRedfishInsecure(t *testing.T) {
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1}})
	rf := redfishtest.Start(t, "root", "calvin-rf", &redfishtest.MemMachine{})
	pw := writePassword(t, rf.Pass, 0o600)
	out := app.ok(t, "machine", "enroll", "rf2", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", pw,
		"--bmc-protocol", "redfish", "--bmc-insecure", "-o", "json")
	if !strings.Contains(out, `"tls_insecure": true`) || strings.Contains(out, "tls_sha256") {
		t.Fatalf("enroll --bmc-insecure:\n%s", out)
	}
	if desc := app.ok(t, "describe", "machine", "rf2"); !strings.Contains(desc, "# bmc certificate: insecure (not verified)\n") {
		t.Fatalf("describe:\n%s", desc)
	}
	if err := rf.RotateCertificate(); err != nil {
		t.Fatal(err)
	}
	if out := app.ok(t, "machine", "power", "status", "rf2"); !strings.Contains(out, "power OFF (via gofish)") {
		t.Fatalf("status: %s", out)
	}
}

// TestBMCRedfishWrongPin: a --bmc-tls-sha256 the BMC does not present
// fails enroll before the password is sent and stores nothing: no
// machine, no address claim (the address enrolls at once on another
// machine), and an existing machine stays as it was.
func TestBMCRedfishWrongPin(t *testing.T) {
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1}})
	rf := redfishtest.Start(t, "root", "calvin-rf", &redfishtest.MemMachine{})
	pw := writePassword(t, rf.Pass, 0o600)
	wrong := strings.Repeat("0f", 32)
	enroll := func(name string, extra ...string) cliResult {
		return app.corral(t, append([]string{"machine", "enroll", name, "--bmc", rf.Addr(), "--bmc-user", rf.User,
			"--bmc-password-file", pw, "--bmc-protocol", "redfish"}, extra...)...)
	}
	r := enroll("rf3", "--bmc-tls-sha256", wrong)
	if r.code != ExitError || !strings.Contains(r.stderr, "presents certificate sha256 "+rf.Fingerprint()+", not the "+wrong) ||
		!strings.Contains(r.stderr, "FailedPrecondition") {
		t.Fatalf("wrong pin: exit %d: %s", r.code, r.stderr)
	}
	if n := rf.Requested(redfishSessionPost); n != 0 || len(rf.Requests()) != 0 {
		t.Fatalf("requests reached a BMC whose certificate did not match: %v", rf.Requests())
	}
	if out := app.ok(t, "get", "machines"); strings.Contains(out, "rf3") {
		t.Fatalf("rf3 created by a refused enroll:\n%s", out)
	}
	// No claim was left on the address.
	app.ok(t, "machine", "enroll", "rf4", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", pw,
		"--bmc-protocol", "redfish", "--bmc-tls-sha256", rf.Fingerprint())
	// A refused re-enroll leaves the machine as it was.
	before := app.ok(t, "get", "machine", "rf4", "-o", "json")
	if r := enroll("rf4", "--bmc-tls-sha256", wrong); r.code != ExitError {
		t.Fatalf("wrong pin on re-enroll: exit %d: %s", r.code, r.stderr)
	}
	if after := app.ok(t, "get", "machine", "rf4", "-o", "json"); after != before {
		t.Fatalf("a refused re-enroll changed the machine:\n%s\n->\n%s", before, after)
	}
	// Bad input: a clear error, nothing sent.
	for name, tc := range map[string]struct {
		extra []string
		code  int
		says  string
	}{
		"both flags":  {[]string{"--bmc-tls-sha256", wrong, "--bmc-insecure"}, ExitUsage, "exclude each other"},
		"not hex":     {[]string{"--bmc-tls-sha256", "not-a-fingerprint"}, ExitError, "64 hex digits"},
		"ipmi + pin":  {[]string{"--bmc-tls-sha256", wrong, "--bmc-protocol", "ipmi"}, ExitError, "IPMI has no certificate"},
		"ipmi + skip": {[]string{"--bmc-insecure", "--bmc-protocol", "ipmi"}, ExitError, "IPMI has no certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			r := enroll("rf5", tc.extra...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.says) {
				t.Fatalf("exit %d (want %d): %s", r.code, tc.code, r.stderr)
			}
		})
	}
}

func TestBMCCertificateNote(t *testing.T) {
	pin := strings.Repeat("ab", 32)
	for name, tc := range map[string]struct {
		bmc  *inventoryv1.Bmc
		want string
	}{
		"pinned":   {&inventoryv1.Bmc{Username: "u", Protocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, TlsSha256: pin}, "pinned sha256 " + pin},
		"insecure": {&inventoryv1.Bmc{Username: "u", Protocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, TlsInsecure: true}, "insecure (not verified)"},
		"enrolled before pinning": {&inventoryv1.Bmc{Username: "u", Protocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH},
			"not pinned (enrolled before BMC certificates were pinned: enroll it again)"},
		"auto answered by redfish": {&inventoryv1.Bmc{Username: "u", Provider: "gofish"},
			"not pinned (enrolled before BMC certificates were pinned: enroll it again)"},
		"ipmi":         {&inventoryv1.Bmc{Username: "u", Protocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, Provider: "native-ipmi"}, ""},
		"no bmc":       {nil, ""},
		"address only": {&inventoryv1.Bmc{Address: "10.0.0.1"}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			if got := bmcCertificate(&inventoryv1.Machine{Bmc: tc.bmc}); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
