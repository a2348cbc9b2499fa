package appliance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/require"
)

// TestAPIModuleExample: the API module's example program, built as a user
// builds it (its own module, the appliance's not linked in), lists every
// machine of a running appliance through admin.conf, over several pages.
func TestAPIModuleExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir := t.TempDir()
	srv, cc := startServer(t, dir)
	ctx := context.Background()
	agent := nodev1.NewAgentServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_AGENT)))
	serials := []string{"SN-API-1", "SN-API-2", "SN-API-3", "SN-API-4"}
	for i, serial := range serials {
		_, err := agent.Register(ctx, &nodev1.RegisterRequest{
			BootMac: fmt.Sprintf("52:54:00:aa:00:%02x", i+1),
			Facts: &inventoryv1.Facts{System: &inventoryv1.Facts_System{
				Serial: serial, Uuid: fmt.Sprintf("5b3c5a84-6c1c-4b0e-9d5b-5f1e0d3e7a%02x", i+1),
			}},
		})
		if err != nil {
			t.Fatalf("Register %q: %v", serial, err)
		}
	}

	bin := filepath.Join(t.TempDir(), "list-machines")
	build := exec.Command("go", "build", "-o", bin, "./examples/list-machines")
	build.Dir = filepath.Join("..", "api")
	if out, err := build.CombinedOutput(); err != nil {
		require.Missing(t, "go build the example: %v\n%s", err, out)
	}
	// The appliance's dependencies are not in the binary: the module
	// builds alone.
	deps, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, heavy := range []string{"go.etcd.io/bbolt", "github.com/pin/tftp", "github.com/bmc-toolbox/bmclib", "github.com/corralhq/corral "} {
		if strings.Contains(string(deps), heavy) {
			t.Errorf("the example links %s", heavy)
		}
	}

	run := exec.Command(bin, "-page-size", "3")
	run.Env = append(os.Environ(), "CORRAL_CONFIG="+filepath.Join(dir, AdminConfigFile))
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("list-machines: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(serials) {
		t.Fatalf("list-machines printed %d lines, want %d:\n%s", len(lines), len(serials), out)
	}
	for _, line := range lines {
		if !strings.Contains(line, "INVENTORIED") {
			t.Errorf("line %q lacks the state", line)
		}
	}

	// A wrong context is a clear error, not a connection attempt.
	bad := exec.Command(bin, "-context", "nowhere")
	bad.Env = run.Env
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), `unknown context "nowhere"`) {
		t.Errorf("unknown context: %v\n%s", err, out)
	}
}
