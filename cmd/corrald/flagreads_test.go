package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoFlagReadsByName: the binaries read their settings from the typed
// fields their flags are bound to (flags.go), never by name through
// pflag's Get* (whose error, dropped, turns a misspelt name into a silent
// zero value).
func TestNoFlagReadsByName(t *testing.T) {
	byName := regexp.MustCompile(`\.Get(String|Bool|Int|Int32|Int64|Uint|Uint32|Uint64|Duration|Float64|StringSlice|StringArray|IntSlice)\("`)
	var files []string
	for _, dir := range []string{".", "../corral-lab", "../corral-node", "../corral", "../corral/cli"} {
		m, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 20 {
		t.Fatalf("found only %d files", len(files))
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if byName.MatchString(line) {
				t.Errorf("%s:%d reads a flag by name: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
