// Module-wide guards: import boundaries of the node agent and one package
// doc per package.
package corral_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type goPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Deps       []string
}

func goList(t *testing.T, args ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestNodeAgentImports keeps the initramfs small and the trust boundary
// clear: nothing reachable from cmd/corral-node may import the appliance's
// store, BMC or boot code.
func TestNodeAgentImports(t *testing.T) {
	forbidden := []string{
		"go.etcd.io/bbolt",
		"go.etcd.io/etcd",
		"github.com/bmc-toolbox/bmclib",
		"github.com/corralhq/corral/store",
		"github.com/corralhq/corral/ipmi",
		"github.com/corralhq/corral/boot",
	}
	pkgs := goList(t, "-deps=false", "./cmd/corral-node")
	if len(pkgs) != 1 {
		t.Fatalf("go list ./cmd/corral-node: got %d packages", len(pkgs))
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/corral-node")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("cmd/corral-node reaches %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}

// TestLabNotShipped: the test-support tree (testsupport/, home of the
// virtual rack testsupport/lab behind corral-lab, the simulators and the
// test images) drives the product from outside; nothing shipped may link
// any of it.
func TestLabNotShipped(t *testing.T) {
	const testsupport = "github.com/corralhq/corral/testsupport"
	for _, main := range []string{"./cmd/corrald", "./cmd/corral", "./cmd/corral-node"} {
		out, err := exec.Command("go", "list", "-deps", main).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == testsupport || strings.HasPrefix(dep, testsupport+"/") {
				t.Errorf("%s links %s", main, dep)
			}
		}
	}
}

// TestOnePackageDoc: every package has exactly one file with a package doc
// comment.
func TestOnePackageDoc(t *testing.T) {
	for _, p := range goList(t, "./...") {
		files := append(append([]string{}, p.GoFiles...), p.CgoFiles...)
		if len(files) == 0 {
			continue
		}
		var withDoc []string
		fset := token.NewFileSet()
		for _, f := range files {
			af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil {
				withDoc = append(withDoc, f)
			}
		}
		if len(withDoc) != 1 {
			t.Errorf("%s: %d files carry a package doc, want exactly 1: %v", p.ImportPath, len(withDoc), withDoc)
		}
	}
}
