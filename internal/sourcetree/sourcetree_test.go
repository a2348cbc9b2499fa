package sourcetree

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFind(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("corral/go.mod", "module github.com/corralhq/corral\n\ngo 1.26\n")
	write("corral/cmd/corrald/main.go", "package main\n")
	write("corral/vendor/other/go.mod", "module example.com/other\n")
	write("elsewhere/go.mod", "module example.com/elsewhere\n")
	for name, tc := range map[string]struct {
		start   string
		want    string
		wantErr error
	}{
		"the root":            {start: "corral", want: "corral"},
		"below the root":      {start: "corral/cmd/corrald", want: "corral"},
		"past another go.mod": {start: "corral/vendor/other", want: "corral"},
		"outside":             {start: "elsewhere", wantErr: ErrNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Find(filepath.Join(root, tc.start))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Find = %q, %v; want error %v", got, err, tc.wantErr)
			}
			if tc.wantErr == nil && got != filepath.Join(root, tc.want) {
				t.Errorf("Find = %q, want %q", got, filepath.Join(root, tc.want))
			}
		})
	}
}

// TestFindThisTree: the package's own directory is inside the tree.
func TestFindThisTree(t *testing.T) {
	got, err := FindFromWorkingDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(got, "internal", "sourcetree")); err != nil {
		t.Errorf("FindFromWorkingDir = %q: %v", got, err)
	}
}
