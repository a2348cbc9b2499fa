package ipmi_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTestPeersNotShipped: the ipmi_sim/QEMU harness and the Redfish test
// server are test support; corrald must not link them.
func TestTestPeersNotShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/corralhq/corral/cmd/corrald").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/corralhq/corral/ipmi/ipmitest") {
			t.Fatalf("corrald imports test peer %s", dep)
		}
	}
}
