package api

import (
	"os/exec"
	"strings"
	"testing"
)

// allowedModules are the modules the API module may pull into a user's
// build: gRPC, protobuf and what they need, and the two small libraries
// of the client configuration. The appliance's dependencies (stores,
// boot servers, BMC libraries) must never appear.
var allowedModules = []string{
	"github.com/corralhq/corral/api",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"google.golang.org/genproto/",
	"golang.org/x/net",
	"golang.org/x/sys",
	"golang.org/x/text",
	"github.com/google/renameio/v2",
	"sigs.k8s.io/yaml",
}

// TestModuleDependencies: every package the module's non-test code
// imports is the standard library's or an allowed module's.
func TestModuleDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		ok := false
		for _, m := range allowedModules {
			if strings.HasPrefix(pkg, m) {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("the API module imports %s: only gRPC, protobuf and the client configuration's libraries may be imported", pkg)
		}
	}
}
