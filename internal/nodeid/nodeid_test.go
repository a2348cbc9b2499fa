package nodeid

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/testsupport/require"
)

// TestLeaf: both sides of the node/appliance boundary import this
// package, so it must not pull anything of Corral's along.
func TestLeaf(t *testing.T) {
	const self = "github.com/corralhq/corral/internal/nodeid"
	out, err := exec.Command("go", "list", "-deps", self).Output()
	if err != nil {
		require.Missing(t, "go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/corralhq/corral/") && dep != self {
			t.Errorf("%s imports %s", self, dep)
		}
	}
}

// TestOrganization: the client configuration in the API module refuses
// a server certificate carrying the node Organization; both must name the
// same one.
func TestOrganization(t *testing.T) {
	if Organization != clientconfig.NodeOrganization {
		t.Fatalf("nodeid.Organization %q != clientconfig.NodeOrganization %q", Organization, clientconfig.NodeOrganization)
	}
}
