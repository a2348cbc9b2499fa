package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the DAG parser. The seed corpus is
// testdata/fuzz/FuzzParse plus the n0stack usecase files. Parse must not
// panic; it either returns a *ParseError wrapping ErrInvalid with at least
// one problem, or a plan whose order runs every task after its
// dependencies, each with a resolved method and request.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/usecases/*.yaml")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		plan, err := Parse(data)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrInvalid) || len(pe.Problems) == 0 || plan != nil {
				t.Fatalf("bad failure: plan %v, err %#v", plan, err)
			}
			return
		}
		if len(plan.Tasks) == 0 {
			t.Fatal("valid plan without tasks")
		}
		pos := map[string]int{}
		for i, task := range plan.Tasks {
			if _, dup := pos[task.Name]; dup {
				t.Fatalf("task %q twice", task.Name)
			}
			pos[task.Name] = i
			if task.Method == nil || task.Request == nil || plan.Task(task.Name) != task {
				t.Fatalf("task %q incomplete", task.Name)
			}
		}
		for i, task := range plan.Tasks {
			for _, d := range task.DependsOn {
				j, ok := pos[d]
				if !ok || j >= i {
					t.Fatalf("task %q at %d depends on %q at %d (present %v)", task.Name, i, d, j, ok)
				}
			}
		}
	})
}
