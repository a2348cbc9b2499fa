package cli

import (
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// TestBMCRotateThroughCorrald: enroll --bmc-rotate, then corral machine
// bmc rotate, against corrald
// and ipmi_sim: the machine then logs in as Corral's own account (power
// status answers through it), describe shows the account and no
// password, and the call is on the machine's timeline.
func TestBMCRotateThroughCorrald(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim")
	}
	b := ipmisim.Start(t, ipmisim.Options{})
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1}})
	pw := writePassword(t, b.Pass, 0o600)
	app.ok(t, "machine", "enroll", "m1", "--bmc", b.Addr(), "--bmc-user", b.User, "--bmc-password-file", pw, "--mac", "52:54:00:00:00:72", "--bmc-rotate")
	if out := app.ok(t, "describe", "machine", "m1"); !strings.Contains(out, "username: corral-a") {
		t.Fatalf("enroll --bmc-rotate did not leave the machine on corral-a:\n%s", out)
	}
	out := app.ok(t, "machine", "bmc", "rotate", "m1")
	if !strings.Contains(out, `BMC user "corral-b"`) || !strings.Contains(out, "disabled user") {
		t.Fatalf("second rotate said:\n%s", out)
	}
	app.ok(t, "machine", "power", "status", "m1")
	desc := app.ok(t, "describe", "machine", "m1")
	for _, want := range []string{"username: corral-b", "account_id: 4", "rotated_at:"} {
		if !strings.Contains(desc, want) {
			t.Errorf("describe lacks %q:\n%s", want, desc)
		}
	}
	tl := app.ok(t, "machine", "timeline", "m1")
	if strings.Count(tl, "bmc-rotated") != 2 || !strings.Contains(tl, "rotate BMC credentials by") {
		t.Errorf("timeline lacks two bmc-rotated entries or the audited call:\n%s", tl)
	}
}
