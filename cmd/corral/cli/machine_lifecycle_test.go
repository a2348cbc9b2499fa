package cli

import (
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestMachineLifecycleVerbs(t *testing.T) {
	for name, tc := range map[string]struct {
		args   []string
		code   int
		req    proto.Message
		stdout string
		stderr string
	}{
		"accept auto":       {args: []string{"machine", "accept", "m1"}, req: &inventoryv1.AcceptMachineRequest{Name: "m1", Disk: "auto"}, stdout: "machine m1: INSTALLING/-; install i1 on auto"},
		"accept disk wipe":  {args: []string{"machine", "accept", "m1", "--disk", "/dev/vdb", "--wipe"}, req: &inventoryv1.AcceptMachineRequest{Name: "m1", Disk: "/dev/vdb", Wipe: true}, stdout: "on /dev/vdb"},
		"reprovision":       {args: []string{"machine", "reprovision", "m1"}, req: &inventoryv1.ReprovisionMachineRequest{Name: "m1"}, stdout: "reboot the machine into network boot"},
		"maintenance on":    {args: []string{"machine", "maintenance", "on", "m1", "--reason", "fan"}, req: &inventoryv1.SetMaintenanceRequest{Name: "m1", On: true, Reason: "fan"}, stdout: "machine m1: MAINTENANCE (fan)"},
		"maintenance off":   {args: []string{"machine", "maintenance", "off", "m1"}, req: &inventoryv1.SetMaintenanceRequest{Name: "m1"}, stdout: "machine m1: INVENTORIED"},
		"maintenance bogus": {args: []string{"machine", "maintenance", "maybe", "m1"}, code: ExitUsage, stderr: "use on or off"},
		"accept no name":    {args: []string{"machine", "accept"}, code: ExitUsage, stderr: "wrong number of arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			if tc.req == nil {
				return
			}
			got := s.received()
			if len(got) != 1 {
				t.Fatalf("requests %v", got)
			}
			if d := cmp.Diff(tc.req, got[0], protocmp.Transform()); d != "" {
				t.Fatalf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestMachineStateCellShowsInstallStep(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_INSTALLING, Install: &inventoryv1.Install{Step: "format"}}
	if got := machineKind.row(m)[6]; got != "INSTALLING/format" {
		t.Fatalf("STATE %q", got)
	}
}
