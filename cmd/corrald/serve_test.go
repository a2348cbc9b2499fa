package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/internal/flagconf"
)

// serveWith runs `corrald ARGS` with a serve that records its
// configuration instead of starting the appliance.
func serveWith(t *testing.T, args ...string) (appliance.Config, error) {
	t.Helper()
	var got appliance.Config
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut, func(_ context.Context, c appliance.Config) error {
		got = c
		return nil
	})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return got, err
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "corrald.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeConfigFile: `corrald serve --config FILE` parses the file into
// the appliance configuration, under the environment and the command
// line.
func TestServeConfigFile(t *testing.T) {
	def, err := serveWith(t, "serve")
	if err != nil {
		t.Fatalf("serve without a file: %v", err)
	}
	path := writeConfig(t, `
# keys are the flag names
data-dir: /srv/corral
api-listen: ":9999"
api-san: [corral.example, 10.0.0.2]
boot-interface: br0
dhcp-mode: full
dhcp-range: 10.0.0.100-10.0.0.199
dhcp-dns:
  - 10.0.0.1
  - 10.0.0.53
dhcp-lease-time: 2h
no-ra: true
allow-test-images: true
bmc-poll-concurrency: 4
bmc-providers: [ipmitool]
boot-watchdog: 90s
auto-accept: true
auto-accept-selector: ["disk.count>=2"]
log-level: debug
`)
	t.Setenv("CORRAL_DHCP_RANGE", "10.0.0.150-10.0.0.160")
	got, err := serveWith(t, "serve", "--config", path, "--api-listen", ":20180")
	if err != nil {
		t.Fatalf("serve --config: %v", err)
	}
	want := def
	want.DataDir = "/srv/corral"
	want.APIListen = ":20180" // the command line wins
	want.APISANs = []string{"corral.example", "10.0.0.2"}
	want.Boot.Interface = "br0"
	want.Boot.DHCPMode = "full"
	want.Boot.DHCPRange = "10.0.0.150-10.0.0.160" // the environment wins
	want.Boot.DHCPDNS = []string{"10.0.0.1", "10.0.0.53"}
	want.Boot.DHCPLeaseTime = 2 * time.Hour
	want.Boot.NoRA = true
	want.BMC.PollConcurrency = 4
	want.BMC.Providers = []string{"ipmitool"}
	want.Lifecycle.BootWatchdog = 90 * time.Second
	want.Lifecycle.AutoAccept = true
	want.Lifecycle.AutoAcceptSelectors = []string{"disk.count>=2"}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(appliance.Config{}, "Logger")); diff != "" {
		t.Errorf("appliance.Config (-want +got):\n%s", diff)
	}
	if !got.Logger.Enabled(context.Background(), -4) {
		t.Error("log-level: debug from the file: debug logging is off")
	}
}

func TestServeConfigFileErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		file    string
		wantErr error
		names   []string
	}{
		"unknown key":  {file: "dhcp-mode: full\nboot-iface: br0\n", wantErr: flagconf.ErrUnknownKey, names: []string{`"boot-iface"`}},
		"wrong type":   {file: "bmc-poll-concurrency: lots\n", wantErr: flagconf.ErrBadValue, names: []string{`"bmc-poll-concurrency"`, "want int"}},
		"list for one": {file: "dhcp-mode: [full]\n", wantErr: flagconf.ErrBadValue, names: []string{`"dhcp-mode"`}},
	} {
		t.Run(name, func(t *testing.T) {
			path := writeConfig(t, tc.file)
			_, err := serveWith(t, "serve", "--config", path)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("serve --config = %v, want %v", err, tc.wantErr)
			}
			for _, want := range append(tc.names, path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}

// TestServeIgnoresClientConfig: CORRAL_CONFIG is the corral CLI's client
// file (corral-lab tells people to export it, and starts corrald from the
// same shell): corrald serve does not read it as its own file.
func TestServeIgnoresClientConfig(t *testing.T) {
	t.Setenv("CORRAL_CONFIG", writeConfig(t, "endpoint: 10.0.0.1:20180\ntoken: crl_x\n"))
	if _, err := serveWith(t, "serve"); err != nil {
		t.Fatalf("serve with CORRAL_CONFIG set: %v", err)
	}
}

// TestServeValidation: a value the file sets is checked like the flag's.
func TestServeValidation(t *testing.T) {
	path := writeConfig(t, "bmc-poll-concurrency: 0\n")
	if _, err := serveWith(t, "serve", "--config", path); err == nil || !strings.Contains(err.Error(), "--bmc-poll-concurrency 0") {
		t.Errorf("serve = %v, want the --bmc-poll-concurrency check", err)
	}
}

// TestServeBMCMediaURL: a media URL a BMC could not fetch from is refused
// at start, naming the flag.
func TestServeBMCMediaURL(t *testing.T) {
	for _, bad := range []string{"ftp://10.0.0.1/", "http://", "10.0.0.1:8080", "http://10.0.0.1/?x=1"} {
		if _, err := serveWith(t, "serve", "--bmc-media-url", bad); err == nil || !strings.Contains(err.Error(), "--bmc-media-url") {
			t.Errorf("--bmc-media-url %q: %v, want it refused", bad, err)
		}
	}
	if _, err := serveWith(t, "serve", "--bmc-media-url", "http://10.0.0.1:8080"); err != nil {
		t.Errorf("--bmc-media-url http://10.0.0.1:8080: %v", err)
	}
}
