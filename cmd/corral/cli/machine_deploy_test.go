package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func (f fakeMachines) DeployMachine(_ context.Context, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("DeployMachine", req); err != nil {
		return nil, err
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: inventoryv1.Machine_DEPLOYING, StateReason: "deploying " + req.GetOsImage() + ": plan sent to the discovery agent",
		Deployment: &inventoryv1.Deployment{DeploymentId: "d1", OsImage: req.GetOsImage()}}, nil
}

func TestMachineDeploy(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys := write("keys", "# mine\nssh-ed25519 AAAAC3Nza a@b\n\nssh-rsa AAAAB3Nza c@d\n")
	more := write("more.pub", "ssh-ed25519 AAAAC3Nzb e@f")
	layout := write("layout.yaml", "disks: [{name: root, device: auto}]\nimage: root\n")
	userData := write("user-data", "#cloud-config\nhostname: x\n")
	big := write("big", strings.Repeat("x", maxDeployUserData+1))
	for name, tc := range map[string]struct {
		args   []string
		code   int
		req    proto.Message
		stdout string
		stderr string
	}{
		"deploy": {args: []string{"machine", "deploy", "m1", "--image", "debian-12", "--layout", layout, "--user-data", userData,
			"--ssh-key", keys, "--ssh-key", more, "--hostname", "web-1"},
			req: &inventoryv1.DeployMachineRequest{Name: "m1", OsImage: "debian-12", Layout: "disks: [{name: root, device: auto}]\nimage: root\n",
				UserData: []byte("#cloud-config\nhostname: x\n"), SshKeys: []string{"ssh-ed25519 AAAAC3Nza a@b", "ssh-rsa AAAAB3Nza c@d", "ssh-ed25519 AAAAC3Nzb e@f"},
				Hostname: "web-1"},
			stdout: "machine m1: DEPLOYING/- (deploying debian-12: plan sent to the discovery agent)"},
		"no image":          {args: []string{"machine", "deploy", "m1"}, code: ExitUsage, stderr: "--image"},
		"user data too big": {args: []string{"machine", "deploy", "m1", "--image", "i", "--user-data", big}, code: ExitUsage, stderr: "larger than 65536 bytes"},
		"missing layout":    {args: []string{"machine", "deploy", "m1", "--image", "i", "--layout", filepath.Join(dir, "nope")}, code: ExitUsage, stderr: "--layout"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			got := s.received()
			if tc.req == nil {
				if len(got) != 0 {
					t.Fatalf("requests sent: %v", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("requests %v", got)
			}
			if d := cmp.Diff(tc.req, got[0], protocmp.Transform()); d != "" {
				t.Fatalf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestDeployNotes(t *testing.T) {
	var b strings.Builder
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_DEPLOYING,
		Deployment: &inventoryv1.Deployment{DeploymentId: "d1", Step: "image", Detail: "1 of 2 GiB", UserDataSha256: "abc"}}
	if err := deployNotes(&b, m); err != nil {
		t.Fatal(err)
	}
	if want := "# deployment d1: DEPLOYING: image 1 of 2 GiB; user data kept by the appliance, not shown (sha256 abc)\n"; b.String() != want {
		t.Fatalf("%q, want %q", b.String(), want)
	}
}
