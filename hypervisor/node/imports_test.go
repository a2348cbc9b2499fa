package node

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

// TestImports: this package is reachable from cmd/corral-node, so it must
// not reach the appliance's store, BMC or boot code (the module-wide guard
// checks cmd/corral-node once it imports this package).
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		require.Missing(t, "go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range []string{"go.etcd.io/bbolt", "go.etcd.io/etcd", "github.com/bmc-toolbox/bmclib",
			"github.com/corralhq/corral/store", "github.com/corralhq/corral/ipmi", "github.com/corralhq/corral/boot"} {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("hypervisor/node reaches %s", dep)
			}
		}
	}
}
