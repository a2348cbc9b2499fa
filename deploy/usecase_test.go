package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsecases parses and validates n0stack's documented DAG files
// (docs "Usecases", copied unchanged apart from source_url) against
// Corral's API: every type, action and args field must exist here. Three
// of the documented files are broken upstream (a dependency on a task the
// file does not define, and one YAML syntax error); for those the test
// pins the exact problem, and checks that nothing else in them is wrong.
func TestUsecases(t *testing.T) {
	tests := map[string]struct {
		tasks int
		// upstream lists the problems n0stack's own file has; n0cli
		// rejects these files too.
		upstream []string
		// repair, when the upstream problem hides the rest of the file,
		// is an old/new replacement that fixes it in memory, and
		// afterRepair the problems left.
		repair      [2]string
		afterRepair []string
	}{
		"boot-vm-from-image.yaml":               {tasks: 3},
		"boot-vm-from-image-inverse.yaml":       {tasks: 3},
		"boot-vm-from-image-idempotent.yaml":    {tasks: 6},
		"boot-vm-from-iso-inverse.yaml":         {tasks: 3},
		"register-blockstorage-as-image.yaml":   {tasks: 3},
		"generate-blockstorage-from-image.yaml": {tasks: 1},
		"boot-vm-from-iso.yaml": {upstream: []string{
			`task "CreateVirtualMachine" (line 21): depends_on "CreateBlockStorage": no such task`,
		}},
		"delete-image.yaml": {upstream: []string{
			`task "Remove_cloudimage-ubuntu" (line 1): depends_on "Delete_test-vm": no such task`,
		}},
		"delete-image-detailed.yaml": {upstream: []string{
			`invalid YAML: yaml: line 23: mapping values are not allowed in this context`,
		},
			repair: [2]string{"image_name: cloudimage-ubuntu:\n", "image_name: cloudimage-ubuntu\n"},
			afterRepair: []string{
				`task "Untag_1804_from_cloudimage-ubuntu" (line 1): depends_on "Delete_test-vm": no such task`,
				`task "Untag_latest_from_cloudimage-ubuntu" (line 10): depends_on "Delete_test-vm": no such task`,
			},
		},
	}
	files, err := filepath.Glob("testdata/usecases/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(tests) {
		t.Errorf("testdata/usecases has %d files, the table %d", len(files), len(tests))
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata/usecases", name))
			if err != nil {
				t.Fatal(err)
			}
			plan, err := Parse(data)
			if tc.upstream == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if len(plan.Tasks) != tc.tasks {
					t.Errorf("got %d tasks, want %d", len(plan.Tasks), tc.tasks)
				}
				return
			}
			checkProblems(t, err, tc.upstream)
			if tc.repair[0] != "" {
				if !strings.Contains(string(data), tc.repair[0]) {
					t.Fatalf("repair %q not found", tc.repair[0])
				}
				_, err := Parse([]byte(strings.Replace(string(data), tc.repair[0], tc.repair[1], 1)))
				checkProblems(t, err, tc.afterRepair)
			}
		})
	}
}

// checkProblems wants err to be a *ParseError with exactly want.
func checkProblems(t *testing.T, err error, want []string) {
	t.Helper()
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse: got %v, want the problems %q", err, want)
	}
	if got := strings.Join(pe.Problems, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// TestLabDAG: the README's virtual-rack example parses and keeps its order.
func TestLabDAG(t *testing.T) {
	data, err := os.ReadFile("testdata/lab-vm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(plan.Tasks) != 3 {
		t.Fatalf("got %d tasks, want 3", len(plan.Tasks))
	}
}
