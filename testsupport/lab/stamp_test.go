package lab

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStampConsoles(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "bench", "round-1")
	stop, err := StampConsoles(dir, out)
	if err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(dir, "run", "machines", "lab-1", "console.log")
	if err := os.MkdirAll(filepath.Dir(console), 0o755); err != nil {
		t.Fatal(err)
	}
	appendTo := func(s string) {
		f, err := os.OpenFile(console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
		time.Sleep(3 * stampEvery)
	}
	appendTo("[    0.000000] Linux version 6.1\n[    6.64] Run /init")
	appendTo(" as init process\ncorral: hypervisor boot\n")
	// A new round's up recreates the file: it is read from its start.
	os.Remove(console)
	appendTo("again\n")
	appendTo("no end")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "lab-1.console.log"))
	if err != nil {
		t.Fatal(err)
	}
	stamp := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d\d\d `)
	var lines []string
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if !stamp.MatchString(l) {
			t.Errorf("line %q has no stamp", l)
		}
		lines = append(lines, stamp.ReplaceAllString(l, ""))
	}
	want := []string{"[    0.000000] Linux version 6.1", "[    6.64] Run /init as init process", "corral: hypervisor boot", "again", "no end"}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("stamped console (-want +got):\n%s", diff)
	}
}
