package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/clidocs"
)

// TestCLIReference: docs/cli holds the reference of corral's command tree
// as it is; CORRAL_WRITE_DOCS=1 (make docs) rewrites it instead.
func TestCLIReference(t *testing.T) {
	inv := &invocation{app: &App{}}
	root := inv.rootCommand()
	const dir = "../../../docs/cli"
	if os.Getenv("CORRAL_WRITE_DOCS") != "" {
		if err := clidocs.Write(root, dir); err != nil {
			t.Fatal(err)
		}
		return
	}
	diffs, err := clidocs.Diff(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) > 0 {
		t.Errorf("docs/cli differs from corral's commands (run make docs):\n%s", strings.Join(diffs, "\n"))
	}
}
