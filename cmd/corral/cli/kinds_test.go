package cli

import (
	"strings"
	"testing"

	"github.com/corralhq/corral/deploy"
)

// TestApplyAndDoShareRegistry runs `corral apply` and `corral do` on the
// same request of every appliable kind of deploy.DefaultRegistry: a
// document of the kind and a task of its type and apply action, both with
// a field the request does not have. Both are refused before anything is
// sent, with the same words naming the field.
func TestApplyAndDoShareRegistry(t *testing.T) {
	n := 0
	for _, rk := range deploy.DefaultRegistry().Kinds() {
		if rk.Apply == "" {
			continue
		}
		n++
		t.Run(rk.Name, func(t *testing.T) {
			s := newTestServer(t)
			apply := s.run(t, "kind: "+rk.Name+"\nname: x\nnics_count: 2\n", nil, "apply", "-f", "-")
			do := s.run(t, "t:\n  type: "+rk.Type+"\n  action: "+rk.Apply+"\n  args: {name: x, nics_count: 2}\n", nil, "do", "-")
			if apply.code != ExitUsage || do.code != ExitUsage {
				t.Fatalf("apply exit %d, do exit %d; want %d for both", apply.code, do.code, ExitUsage)
			}
			applyMsg := fieldProblem(apply.stderr)
			if applyMsg == "" || applyMsg != fieldProblem(do.stderr) {
				t.Errorf("apply says %q, do says %q; want the same unknown field message", apply.stderr, do.stderr)
			}
			if got := s.received(); len(got) != 0 {
				t.Errorf("sent %v", got)
			}
		})
	}
	if n < 5 {
		t.Errorf("only %d appliable kinds", n)
	}
}

// fieldProblem cuts `unknown field "nics_count" in X (valid: ...)` out of
// a one-line error of apply or do.
func fieldProblem(stderr string) string {
	i := strings.Index(stderr, `unknown field "nics_count" in `)
	if i < 0 {
		return ""
	}
	msg := strings.TrimSuffix(stderr[i:], "\n")
	return strings.TrimSuffix(msg, "; nothing was run")
}

// TestKindsMatchRegistry checks that every kind of the registry has a
// table for get, describe and delete, and that every table is a kind of
// the registry under the same canonical name.
func TestKindsMatchRegistry(t *testing.T) {
	reg := deploy.DefaultRegistry()
	for _, rk := range reg.Kinds() {
		if _, ok := tableOf(rk); !ok {
			t.Errorf("registry kind %s has no table", rk.Name)
		}
		for _, name := range append([]string{rk.Name}, rk.Aliases...) {
			if k, ok := lookupKind(name); !ok || k.name != rk.Name {
				t.Errorf("lookupKind(%q) = %v, %v; want kind %s", name, k, ok, rk.Name)
			}
		}
	}
	for _, k := range kinds {
		if rk, ok := reg.Kind(k.name); !ok || rk.Name != k.name {
			t.Errorf("table %s is not a registry kind", k.name)
		}
	}
	const want = "node|nodes, network|networks|net, virtual_machine|vm|vms|virtual_machines, block_storage|bs|block_storages, image|images, os_image|os_images, machine|machines"
	if got := kindList(); got != want {
		t.Errorf("kindList() = %q, want %q", got, want)
	}
}

func TestApplyHelpListsRegistryKinds(t *testing.T) {
	want := `  node            ApplyNodeRequest
  network         ApplyNetworkRequest
  virtual_machine CreateVirtualMachineRequest
  block_storage   CreateBlockStorageRequest; FetchBlockStorageRequest when source_url is set
  image           ApplyImageRequest
  os_image        RegisterOSImageRequest
`
	if got := applyKindHelp(deploy.DefaultRegistry()); got != want {
		t.Errorf("applyKindHelp:\n%s\nwant:\n%s", got, want)
	}
}
