package discovery

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/internal/imagecache"
	"github.com/corralhq/corral/testsupport/require"
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
			got, err := resolveIn(root, tc.in)
			if tc.fails {
				if err == nil {
					t.Fatalf("resolveIn(%q) = %q, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resolveIn(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	// Inside the root, an absolute target resolves there.
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("x"), 0o644))
	if got, err := resolveIn(root, "usr/lib/abs"); err != nil || got != "etc/passwd" {
		t.Fatalf("resolveIn(abs) = %q, %v; want etc/passwd inside the root", got, err)
	}
}

// TestELFClosureHost resolves the build host's own /bin/true (amd64) as a
// root of "/": its loader and libc, found through the multiarch dirs.
func TestELFClosureHost(t *testing.T) {
	if _, err := os.Stat("/usr/bin/true"); err != nil {
		t.Skip("no /usr/bin/true")
	}
	files, err := elfClosure("/", ArchAMD64, []string{"/usr/bin/true"})
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
	if _, err := elfClosure("/", ArchARM64, []string{"/usr/bin/true"}); err == nil {
		t.Error("an amd64 ELF file passed as arm64")
	}
}

// TestARM64ClosureRuns (on the newest root FetchSysroot unpacked into the
// image cache, or CORRAL_ARM64_SYSROOT; images/e2e's TestARM64Discovery
// makes one) copies the arm64 hypervisor image's files with
// the closure elfClosure found, and nothing else, into an empty root and
// runs qemu-system-aarch64 --version and qemu-img --version there under
// qemu-user: the libraries resolve from what the image carries.
func TestARM64ClosureRuns(t *testing.T) {
	src := os.Getenv("CORRAL_ARM64_SYSROOT")
	if src == "" {
		cache := os.Getenv("CORRAL_IMAGE_CACHE")
		if cache == "" {
			cache = imagecache.Default()
		}
		roots, _ := filepath.Glob(filepath.Join(sysrootDir(cache, ArchARM64), "*", "manifest.json"))
		var newest time.Time
		for _, r := range roots {
			if st, err := os.Stat(r); err == nil && st.ModTime().After(newest) {
				newest, src = st.ModTime(), filepath.Join(filepath.Dir(r), "root")
			}
		}
	}
	require.Tool(t, "qemu-aarch64") // Debian's qemu-user
	if src == "" {
		// None unpacked yet: unpack it, into the image cache, where
		// `corrald images build --arch arm64` finds it later (the cost
		// is paid once per machine either way).
		if testing.Short() {
			t.Skip("unpacks Debian's arm64 QEMU (about 300 MB): skipped with -short")
		}
		require.Tool(t, "mmdebstrap", "apt-cache")
		cache := os.Getenv("CORRAL_IMAGE_CACHE")
		if cache == "" {
			cache = imagecache.Default()
		}
		if err := os.MkdirAll(cache, 0o755); err != nil {
			t.Fatal(err)
		}
		unlock, err := lock(filepath.Join(cache, ".lock"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		t0 := time.Now()
		sr, err := FetchSysroot(ctx, slog.Default(), cache, ArchARM64, append(append([]string(nil), ARM64DiscoverPackages...), ARM64HypervisorPackages...))
		unlock()
		if err != nil {
			t.Fatal(err)
		}
		src = sr.Dir
		t.Logf("arm64 root unpacked in %s (%d packages)", time.Since(t0).Round(time.Second), len(sr.Packages))
	}
	files, err := elfClosure(src, ArchARM64, append(append([]string(nil), DiscoverHostFiles...), ARM64HypervisorHostFiles...))
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f.Src))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, f.Dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d files", len(files))
	for bin, arg := range map[string]string{"usr/bin/qemu-system-aarch64": "--version", "usr/bin/qemu-img": "--version",
		"usr/sbin/mke2fs": "-V", "usr/sbin/lvm": "version", "usr/sbin/mdadm": "--version", "usr/sbin/mkswap": "--version"} {
		out, err := exec.Command("qemu-aarch64", "-L", dst, filepath.Join(dst, bin), arg).CombinedOutput()
		if err != nil {
			t.Errorf("%s --version under qemu-aarch64 -L: %v\n%s", bin, err, out)
			continue
		}
		t.Logf("%s: %s", bin, firstLine(out))
	}
}

func firstLine(b []byte) string {
	for i, c := range b {
		if c == '\n' {
			return string(b[:i])
		}
	}
	return string(b)
}
