package elfroot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResolveInStaysInRoot(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/lib/aarch64-linux-gnu"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/lib/aarch64-linux-gnu/libz.so.1.2.13"), []byte("z"), 0o644))
	must(os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(os.Symlink("libz.so.1.2.13", filepath.Join(root, "usr/lib/aarch64-linux-gnu/libz.so.1")))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "usr/lib/abs")))
	must(os.Symlink("../../../../../../etc/hostname", filepath.Join(root, "usr/lib/up")))
	must(os.Symlink("loop", filepath.Join(root, "usr/lib/loop")))
	for name, tc := range map[string]struct {
		in, want string
		fails    bool
	}{
		"merged usr and a relative link": {in: "/lib/aarch64-linux-gnu/libz.so.1", want: "usr/lib/aarch64-linux-gnu/libz.so.1.2.13"},
		"absolute target is re-rooted":   {in: "usr/lib/abs", fails: true}, // root/etc/passwd does not exist
		"dot-dot stops at the root":      {in: "usr/lib/up", fails: true},  // root/etc/hostname does not exist
		"dot-dot in the path":            {in: "/../../lib/aarch64-linux-gnu/libz.so.1", want: "usr/lib/aarch64-linux-gnu/libz.so.1.2.13"},
		"loop":                           {in: "usr/lib/loop", fails: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ResolveIn(root, tc.in)
			if tc.fails {
				if err == nil {
					t.Fatalf("ResolveIn(%q) = %q, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ResolveIn(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	// Inside the root, an absolute target resolves there.
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("x"), 0o644))
	if got, err := ResolveIn(root, "usr/lib/abs"); err != nil || got != "etc/passwd" {
		t.Fatalf("ResolveIn(abs) = %q, %v; want etc/passwd inside the root", got, err)
	}
}

// TestELFClosureHost resolves the build host's own /bin/true (amd64) as a
// root of "/": its loader and libc, found through the multiarch dirs.
func TestELFClosureHost(t *testing.T) {
	if _, err := os.Stat("/usr/bin/true"); err != nil {
		t.Skip("no /usr/bin/true")
	}
	files, err := Closure("/", "amd64", []string{"/usr/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	var dsts []string
	for _, f := range files {
		dsts = append(dsts, f.Dst)
	}
	// libc needs ld.so by its soname too: found in the multiarch dir.
	want := []string{"lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2", "usr/bin/true"}
	if diff := cmp.Diff(want, dsts); diff != "" {
		t.Errorf("closure of /usr/bin/true (-want +got):\n%s", diff)
	}
	if _, err := Closure("/", "arm64", []string{"/usr/bin/true"}); err == nil {
		t.Error("an amd64 ELF file passed as arm64")
	}
}
