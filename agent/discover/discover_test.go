package discover

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/corralhq/corral/agent/install"
	"github.com/corralhq/corral/agent/netup"
	"github.com/corralhq/corral/agent/session"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/testsupport/fixture"
)

func root(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := fixture.UnpackFile(filepath.Join("..", "facts", "testdata", name+".txtar"), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDryRunPrintsFacts(t *testing.T) {
	var out, console bytes.Buffer
	if err := Run(context.Background(), Config{Root: root(t, "nvme-sata"), DryRun: true, Stdout: &out, Console: &console}); err != nil {
		t.Fatal(err)
	}
	f := &inventoryv1.Facts{}
	if err := protojson.Unmarshal(out.Bytes(), f); err != nil {
		t.Fatalf("output is not Facts JSON: %v\n%s", err, out.String())
	}
	if f.GetSystem().GetSerial() != "7XK2QH3" || len(f.GetDisks()) != 3 {
		t.Errorf("facts = %v", f)
	}
}

func TestRunWiresCmdlineFactsAndSession(t *testing.T) {
	dir := root(t, "oem-placeholders")
	cmd := filepath.Join(t.TempDir(), "cmdline")
	fp := strings.Repeat("0f", 32)
	line := "console=ttyS0 corral.endpoint=10.0.0.1:20180 corral.token=tok-1 corral.ca=" + fp + " BOOTIF=01-70-85-c2-aa-bb-cc"
	if err := os.WriteFile(cmd, []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	var got session.Config
	var netMAC string
	err := Run(context.Background(), Config{
		Root: dir, CmdlineFile: cmd, CAFile: filepath.Join(dir, "none.pem"), Version: "v-test", Console: &console,
		Network: func(_ context.Context, c netup.Config) (*netup.Lease, error) {
			netMAC = c.BootMAC
			return &netup.Lease{Interface: "eno1", MAC: c.BootMAC, Address: "10.0.0.50/24"}, nil
		},
		Session: func(_ context.Context, c session.Config) error { got = c; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if netMAC != "70:85:c2:aa:bb:cc" {
		t.Errorf("DHCP asked on %q, want the BOOTIF MAC", netMAC)
	}
	if got.Endpoint != "10.0.0.1:20180" || got.Token != "tok-1" || got.CAFingerprint != fp || got.BootMAC != "70:85:c2:aa:bb:cc" || got.AgentVersion != "v-test" {
		t.Errorf("session config = %+v", got)
	}
	if _, ok := got.Installer.(*install.Installer); !ok {
		t.Errorf("session installer = %T, want the agent/install one", got.Installer)
	}
	f := got.Facts(context.Background())
	if f.GetSystem().GetSerial() != "To Be Filled By O.E.M." || len(f.GetMissingDrivers()) != 1 {
		t.Errorf("facts = %v", f)
	}
	for _, want := range []string{"appliance 10.0.0.1:20180", "coldplug", "eno1 has 10.0.0.50/24"} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console.String())
		}
	}
}

func TestRunBadCmdlineIsPrinted(t *testing.T) {
	cmd := filepath.Join(t.TempDir(), "cmdline")
	os.WriteFile(cmd, []byte("corral.endpoint=nope corral.token=t\n"), 0o644)
	var console bytes.Buffer
	if err := Run(context.Background(), Config{CmdlineFile: cmd, Console: &console}); err == nil {
		t.Fatal("Run accepted a bad command line")
	}
	if !strings.Contains(console.String(), "cannot start discovery") || !strings.Contains(console.String(), "corral.endpoint") {
		t.Errorf("console = %q", console.String())
	}
}
