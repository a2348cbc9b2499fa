package main

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/clidocs"
	"github.com/spf13/cobra"
)

// docsDir is the committed CLI reference (docs/cli, `make docs`).
const docsDir = "../../docs/cli"

// docsTree is corrald's command tree as the reference shows it: defaults
// that depend on the machine (the image cache's place) are named instead.
func docsTree() *cobra.Command {
	root := newRootCmd(io.Discard, io.Discard, runServer)
	if build, _, err := root.Find([]string{"images", "build"}); err == nil {
		if f := build.Flags().Lookup("image-cache"); f != nil {
			f.DefValue = "the machine-wide image cache"
		}
	}
	return root
}

// TestCLIReference: docs/cli holds the reference of corrald's command
// tree as it is; CORRAL_WRITE_DOCS=1 (make docs) rewrites it instead.
func TestCLIReference(t *testing.T) {
	if os.Getenv("CORRAL_WRITE_DOCS") != "" {
		if err := clidocs.Write(docsTree(), docsDir); err != nil {
			t.Fatal(err)
		}
		return
	}
	diffs, err := clidocs.Diff(docsTree(), docsDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) > 0 {
		t.Errorf("docs/cli differs from corrald's commands (run make docs):\n%s", strings.Join(diffs, "\n"))
	}
}
