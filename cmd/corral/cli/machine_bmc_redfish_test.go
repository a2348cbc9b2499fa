package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestRedfishDay2ThroughCorrald: against corrald (its boot HTTP server
// on loopback serving the OS image catalog) and the Redfish test server:
// bios get/set (pending shown, an unknown key refused), firmware list
// and update from an uploaded image (the BMC fetches it from corrald;
// --sha256 of another sum refused, nothing sent), media insert --boot
// and eject; a viewer token may read but not set, update or insert; an
// IPMI machine is refused with a clear precondition.
func TestRedfishDay2ThroughCorrald(t *testing.T) {
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1, HealthInterval: -1},
		Boot: appliance.BootConfig{Interface: "lo", DHCPMode: "off", TFTPListen: "off", HTTPListen: "127.0.0.1:0", NoRA: true}})
	rf := redfishtest.Start(t, "root", "calvin-rf", &redfishtest.MemMachine{})
	pw := writePassword(t, rf.Pass, 0o600)
	app.ok(t, "machine", "enroll", "rf1", "--bmc", rf.Addr(), "--bmc-user", rf.User, "--bmc-password-file", pw, "--bmc-protocol", "redfish",
		"--mac", "52:54:00:c0:ff:31")

	out := app.ok(t, "machine", "bios", "get", "rf1")
	if !strings.Contains(out, "BootMode") || !strings.Contains(out, "Uefi,LegacyBios") {
		t.Fatalf("bios get:\n%s", out)
	}
	out = app.ok(t, "machine", "bios", "set", "rf1", "BootMode=LegacyBios", "PowerRestoreDelay=20")
	if !strings.Contains(out, "2 settings pending") {
		t.Fatalf("bios set:\n%s", out)
	}
	if r := app.corral(t, "machine", "bios", "set", "rf1", "Turbo=on"); r.code == 0 || !strings.Contains(r.stderr, `unknown BIOS attribute "Turbo"`) {
		t.Fatalf("an unknown key: exit %d %s", r.code, r.stderr)
	}

	dir := t.TempDir()
	fw := filepath.Join(dir, "bmc.bin")
	if err := os.WriteFile(fw, redfishtest.FirmwarePackage("BMC", "1.30", 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "rescue.iso")
	if err := os.WriteFile(iso, []byte("an ISO 9660 image"), 0o644); err != nil {
		t.Fatal(err)
	}
	app.ok(t, "osimage", "upload", "bmc-1.30", fw, "--format", "raw")
	app.ok(t, "osimage", "upload", "rescue", iso, "--format", "raw")
	if out := app.ok(t, "machine", "firmware", "list", "rf1"); !strings.Contains(out, "1.00") {
		t.Fatalf("firmware list:\n%s", out)
	}
	if r := app.corral(t, "machine", "firmware", "update", "rf1", "--image", "bmc-1.30", "--sha256", strings.Repeat("ab", 32)); r.code == 0 ||
		!strings.Contains(r.stderr, "nothing was sent to the BMC") {
		t.Fatalf("update with another sum: exit %d %s", r.code, r.stderr)
	}
	if n := len(rf.SimpleUpdates()); n != 0 {
		t.Fatalf("%d SimpleUpdates reached the BMC", n)
	}
	out = app.ok(t, "machine", "firmware", "update", "rf1", "--image", "bmc-1.30", "--targets", "BMC", "--wait", "1m")
	if !strings.Contains(out, "Completed") || rf.Firmware()["BMC"] != "1.30" {
		t.Fatalf("firmware update:\n%s", out)
	}
	if f := rf.Fetches(); len(f) != 1 || f[0].Bytes != 8192+int64(len("CORRAL-FIRMWARE BMC 1.30\n")) || !strings.Contains(f[0].URI, "/os-images/") {
		t.Fatalf("the BMC fetched %+v", f)
	}
	app.ok(t, "machine", "media", "insert", "rf1", "--image", "rescue", "--boot")
	if img, in := rf.Media(); !in || !strings.Contains(img, "/os-images/") || rf.Boot()["BootSourceOverrideTarget"] != "Cd" {
		t.Fatalf("media: %q %v %v", img, in, rf.Boot())
	}
	app.ok(t, "machine", "media", "eject", "rf1")

	// A viewer reads, and is refused the rest.
	tok := strings.TrimSpace(app.ok(t, "token", "create", "--role", "viewer"))
	app.ok(t, "--token", tok, "machine", "bios", "get", "rf1")
	for _, args := range [][]string{
		{"machine", "bios", "set", "rf1", "BootMode=Uefi"},
		{"machine", "firmware", "update", "rf1", "--image", "bmc-1.30"},
		{"machine", "media", "insert", "rf1", "--image", "rescue"},
	} {
		if r := app.corral(t, append([]string{"--token", tok}, args...)...); r.code == 0 || !strings.Contains(r.stderr, "PermissionDenied") {
			t.Fatalf("a viewer %v: exit %d %s", args, r.code, r.stderr)
		}
	}

	tl := app.ok(t, "machine", "timeline", "rf1")
	for _, want := range []string{"bios-set", "firmware-refused", "firmware-progress", "firmware-updated", "media-inserted", "media-ejected"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %s:\n%s", want, tl)
		}
	}

	// An IPMI machine: a clear precondition, before any BMC is reached.
	if testing.Short() {
		return // the rest starts ipmi_sim
	}
	b := ipmisim.Start(t, ipmisim.Options{})
	app.ok(t, "machine", "enroll", "ip1", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", writePassword(t, b.Pass, 0o600),
		"--bmc-protocol", "ipmi", "--mac", "52:54:00:c0:ff:32")
	if r := app.corral(t, "machine", "bios", "get", "ip1"); r.code == 0 || !strings.Contains(r.stderr, "BMC is IPMI; BIOS over Redfish needs a Redfish BMC") {
		t.Fatalf("an IPMI machine: exit %d %s", r.code, r.stderr)
	}
}
