package discover

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/corralhq/corral/agent/deploy"
	"github.com/corralhq/corral/agent/erase"
	"github.com/corralhq/corral/agent/install"
	"github.com/corralhq/corral/agent/kexec"
	"github.com/corralhq/corral/agent/lldp"
	"github.com/corralhq/corral/agent/netup"
	"github.com/corralhq/corral/agent/session"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
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
	if len(got.Endpoints) != 1 || got.Endpoints[0] != "10.0.0.1:20180" || got.Token != "tok-1" || got.CAFingerprint != fp || got.BootMAC != "70:85:c2:aa:bb:cc" || got.AgentVersion != "v-test" {
		t.Errorf("session config = %+v", got)
	}
	if _, ok := got.Installer.(*install.Installer); !ok {
		t.Errorf("session installer = %T, want the agent/install one", got.Installer)
	}
	if _, ok := got.Kexec.(*kexec.Booter); !ok {
		t.Errorf("session kexec = %T, want the agent/kexec one", got.Kexec)
	}
	if _, ok := got.Deployer.(*deploy.Deployer); !ok {
		t.Errorf("session deployer = %T, want the agent/deploy one", got.Deployer)
	}
	if _, ok := got.Eraser.(*erase.Eraser); !ok {
		t.Errorf("session eraser = %T, want the agent/erase one", got.Eraser)
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

// TestRunHandsEveryEndpointToTheSession: corral.endpoint's list reaches
// the session in order, and the console names it.
func TestRunHandsEveryEndpointToTheSession(t *testing.T) {
	cmd := filepath.Join(t.TempDir(), "cmdline")
	fp := strings.Repeat("0f", 32)
	line := "corral.endpoint=10.0.0.1:20180,10.0.0.2:20180,[fd00::3]:20180 corral.token=tok-1 corral.ca=" + fp + " corral.mac=70:85:c2:aa:bb:cc"
	if err := os.WriteFile(cmd, []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	var got session.Config
	err := Run(context.Background(), Config{
		Root: root(t, "oem-placeholders"), CmdlineFile: cmd, CAFile: "/nonexistent", Console: &console,
		Network: func(_ context.Context, c netup.Config) (*netup.Lease, error) {
			return &netup.Lease{Interface: "eno1", MAC: c.BootMAC, Address: "10.0.0.50/24"}, nil
		},
		Session:   func(_ context.Context, c session.Config) error { got = c; return nil },
		Installer: nopInstaller{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.1:20180", "10.0.0.2:20180", "[fd00::3]:20180"}, got.Endpoints); diff != "" {
		t.Errorf("session endpoints (-want +got):\n%s", diff)
	}
	if want := "appliances 10.0.0.1:20180, 10.0.0.2:20180, [fd00::3]:20180"; !strings.Contains(console.String(), want) {
		t.Errorf("console lacks %q:\n%s", want, console.String())
	}
}

type nopInstaller struct{}

func (nopInstaller) Install(context.Context, *nodev1.InstallPlan, func(context.Context, []byte) ([]byte, error), func(*nodev1.Progress)) error {
	return nil
}
func (nopInstaller) Wipe(context.Context, *nodev1.WipePlan, func(*nodev1.Progress)) error { return nil }

// TestRunBadCmdlineIsPrinted: a command line the agent refuses is printed
// on the console naming what was refused, and no network or session is
// started.
func TestRunBadCmdlineIsPrinted(t *testing.T) {
	rest := " corral.token=t corral.ca=" + strings.Repeat("0f", 32) + " corral.mac=70:85:c2:aa:bb:cc"
	for name, tc := range map[string]struct {
		line string
		want []string
	}{
		"no port":           {line: "corral.endpoint=nope corral.token=t", want: []string{`"nope": want host:port`}},
		"9 endpoints":       {line: "corral.endpoint=a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1" + rest, want: []string{"9 endpoints, at most 8"}},
		"empty element":     {line: "corral.endpoint=a:1,,b:1" + rest, want: []string{"element 2: empty"}},
		"not host:port":     {line: "corral.endpoint=a:1,b:1,appliance-c" + rest, want: []string{`element 3: "appliance-c": want host:port`}},
		"several refusals":  {line: "corral.endpoint=a:1,,b" + rest, want: []string{"element 2: empty", `element 3: "b": want host:port`}},
		"bad host in list":  {line: "corral.endpoint=a:1,b_c:1" + rest, want: []string{"element 2", "b_c"}},
		"bad port in list":  {line: "corral.endpoint=a:1,b:99999" + rest, want: []string{"element 2", `port "99999"`}},
		"the last one wins": {line: "corral.endpoint=a:1 corral.endpoint=a:1,," + rest, want: []string{"element 2: empty"}},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := filepath.Join(t.TempDir(), "cmdline")
			os.WriteFile(cmd, []byte(tc.line+"\n"), 0o644)
			var console bytes.Buffer
			started := false
			err := Run(context.Background(), Config{CmdlineFile: cmd, Console: &console,
				Network: func(context.Context, netup.Config) (*netup.Lease, error) {
					started = true
					return nil, context.Canceled
				},
				Session: func(context.Context, session.Config) error { started = true; return nil },
			})
			if err == nil {
				t.Fatal("Run accepted a bad command line")
			}
			out := console.String()
			if !strings.Contains(out, "cannot start discovery") || !strings.Contains(out, "corral.endpoint") {
				t.Errorf("console = %q", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("console lacks %q: %q", w, out)
				}
			}
			if started {
				t.Error("network or session started on a refused command line")
			}
		})
	}
}

// TestRunAttachesLLDPNeighbours: the NICs with carrier are listened on
// for the window corral.lldp gives, and what is heard reaches the facts
// registered, under its NIC, and the console.
func TestRunAttachesLLDPNeighbours(t *testing.T) {
	dir := root(t, "oem-placeholders")
	cmd := filepath.Join(t.TempDir(), "cmdline")
	line := "corral.endpoint=10.0.0.1:20180 corral.token=tok-1 corral.ca=" + strings.Repeat("0f", 32) + " BOOTIF=01-70-85-c2-aa-bb-cc corral.lldp=12s"
	if err := os.WriteFile(cmd, []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	var asked lldp.Config
	var got session.Config
	err := Run(context.Background(), Config{
		Root: dir, CmdlineFile: cmd, CAFile: filepath.Join(dir, "none.pem"), Console: &console,
		Network: func(_ context.Context, c netup.Config) (*netup.Lease, error) {
			return &netup.Lease{Interface: "eno1", MAC: c.BootMAC, Address: "10.0.0.50/24"}, nil
		},
		LLDP: func(_ context.Context, c lldp.Config) (map[string][]lldp.Neighbor, error) {
			asked = c
			return map[string][]lldp.Neighbor{"eno1": {{ChassisID: "52:54:00:12:34:56", PortID: "Ethernet1/12", SystemName: "leaf-04", VLAN: 42}}}, nil
		},
		Session: func(_ context.Context, c session.Config) error { got = c; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"eno1"}, asked.Interfaces); diff != "" || asked.Window != 12*time.Second {
		t.Errorf("listened on %v for %v, want eno1 for 12s", asked.Interfaces, asked.Window)
	}
	var nics []*inventoryv1.Facts_Nic
	for _, n := range got.Facts(context.Background()).GetNics() {
		if n.GetName() == "eno1" {
			nics = append(nics, n)
		}
	}
	if len(nics) != 1 || len(nics[0].GetLldpNeighbors()) != 1 || nics[0].GetLldpNeighbors()[0].GetPortId() != "Ethernet1/12" || nics[0].GetLldpNeighbors()[0].GetVlanId() != 42 {
		t.Errorf("facts' NICs %v, want eno1 with its neighbour", nics)
	}
	if want := "LLDP on eno1: leaf-04 port Ethernet1/12, VLAN 42"; !strings.Contains(console.String(), want) {
		t.Errorf("console lacks %q:\n%s", want, console.String())
	}
}
