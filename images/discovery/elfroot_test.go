package discovery

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/elfroot"
	"github.com/corralhq/corral/internal/imagecache"
	"github.com/corralhq/corral/testsupport/require"
)

// TestARM64ClosureRuns (on the newest root FetchSysroot unpacked into the
// image cache, or CORRAL_ARM64_SYSROOT; images/e2e's TestARM64Discovery
// makes one) copies the arm64 hypervisor image's files with
// the closure elfroot.Closure found, and nothing else, into an empty root and
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
	files, err := elfroot.Closure(src, ArchARM64, append(append([]string(nil), DiscoverHostFiles...), ARM64HypervisorHostFiles...))
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
