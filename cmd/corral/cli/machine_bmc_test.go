package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestMachineBMCBadInput(t *testing.T) {
	s := newTestServer(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "pw")
	os.WriteFile(good, []byte("secret\n"), 0o600)
	loose := filepath.Join(dir, "loose")
	os.WriteFile(loose, []byte("secret\n"), 0o644)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for name, tc := range map[string]struct {
		args       []string
		code       int
		stderrHas  string
		stderrLack string
	}{
		"missing password file":    {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", filepath.Join(dir, "nope")}, ExitUsage, "no such file", ""},
		"no password file flag":    {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u"}, ExitUsage, "--bmc-password-file is required", ""},
		"empty password file":      {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", empty}, ExitUsage, "is empty", ""},
		"world-readable warns":     {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", loose}, ExitError, "world-readable", ""},
		"private file no warning":  {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", good}, ExitError, "Unimplemented", "readable"},
		"unsupported protocol":     {[]string{"machine", "enroll", "m1", "--bmc", "10.0.0.1", "--bmc-user", "u", "--bmc-password-file", good, "--bmc-protocol", "telnet"}, ExitUsage, "not supported", ""},
		"missing bmc":              {[]string{"machine", "enroll", "m1", "--bmc-user", "u", "--bmc-password-file", good}, ExitUsage, "--bmc ADDR", ""},
		"bad cipher":               {[]string{"machine", "enroll", "m1", "--bmc", "h", "--bmc-user", "u", "--bmc-password-file", good, "--bmc-cipher", "99"}, ExitUsage, "0-17", ""},
		"unknown power action":     {[]string{"machine", "power", "explode", "m1"}, ExitUsage, "unknown power action", ""},
		"power needs a name":       {[]string{"machine", "power", "on"}, ExitUsage, "wrong number of arguments", ""},
		"unknown boot device":      {[]string{"machine", "bootdev", "floppy", "m1"}, ExitUsage, "unknown boot device", ""},
		"power reaches the server": {[]string{"machine", "power", "cycle", "m1"}, ExitError, "Unimplemented", ""},
		"bootdev reaches server":   {[]string{"machine", "bootdev", "pxe", "m1", "--persistent", "--efi"}, ExitError, "Unimplemented", ""},
	} {
		t.Run(name, func(t *testing.T) {
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderrHas) || (tc.stderrLack != "" && strings.Contains(r.stderr, tc.stderrLack)) {
				t.Fatalf("code %d stderr %q (want %d, containing %q)", r.code, r.stderr, tc.code, tc.stderrHas)
			}
			if strings.Contains(r.stderr, "secret") {
				t.Fatal("password printed")
			}
		})
	}
}

func TestPowerCell(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for want, in := range map[string]struct {
		st inventoryv1.PowerState
		at time.Duration
	}{
		"ON 42s":      {inventoryv1.PowerState_POWER_STATE_ON, 42 * time.Second},
		"OFF 3m":      {inventoryv1.PowerState_POWER_STATE_OFF, 3*time.Minute + 5*time.Second},
		"UNKNOWN 26h": {inventoryv1.PowerState_POWER_STATE_UNKNOWN, 26 * time.Hour},
		"ON 3d":       {inventoryv1.PowerState_POWER_STATE_ON, 72 * time.Hour},
	} {
		if got := powerCell(in.st, timestamppb.New(now.Add(-in.at)), now); got != want {
			t.Errorf("got %q want %q", got, want)
		}
	}
	if got := powerCell(inventoryv1.PowerState_POWER_STATE_UNSPECIFIED, nil, now); got != "UNSPECIFIED" {
		t.Errorf("never read: %q", got)
	}
}
