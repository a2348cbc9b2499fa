package images

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fakeIPXEDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, n := range []string{UndionlyKPXE, IPXEEFI, "ipxe.lkrn"} {
		if err := os.WriteFile(filepath.Join(d, n), []byte("binary "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestOpenCopiesAndChecksums(t *testing.T) {
	src := fakeIPXEDir(t)
	dir := filepath.Join(t.TempDir(), "images")
	c, err := Open(Config{Dir: dir, IPXEDirs: []string{src}})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Kind{}
	for _, a := range c.List() {
		names[a.Name] = a.Kind
		b, err := os.ReadFile(a.Path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != a.SHA256 || int64(len(b)) != a.Size {
			t.Errorf("%s: checksum/size mismatch", a.Name)
		}
		if filepath.Dir(a.Path) != dir {
			t.Errorf("%s lives outside the catalog: %s", a.Name, a.Path)
		}
	}
	want := map[string]Kind{UndionlyKPXE: KindIPXE, IPXEEFI: KindIPXE, DiscoverKernel: KindKernel, DiscoverInitrd: KindInitrd}
	if len(names) != len(want) {
		t.Fatalf("catalog = %v, want %v", names, want)
	}
	for n, k := range want {
		if names[n] != k {
			t.Errorf("%s kind = %q, want %q", n, names[n], k)
		}
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil || strings.Count(string(sums), "\n") != 4 {
		t.Fatalf("SHA256SUMS = %q, %v", sums, err)
	}
	if _, _, err := c.Open("../etc/passwd"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(traversal) = %v, want ErrNotFound", err)
	}
	f, a, err := c.Open(IPXEEFI)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if a.Name != IPXEEFI {
		t.Errorf("Open returned %q", a.Name)
	}
	// Reopen: idempotent.
	if _, err := Open(Config{Dir: dir, IPXEDirs: []string{src}}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenWithoutIPXEFails(t *testing.T) {
	_, err := Open(Config{Dir: t.TempDir(), IPXEDirs: []string{t.TempDir()}})
	if err == nil || !strings.Contains(err.Error(), "ipxe package") {
		t.Fatalf("err = %v, want a hint to install ipxe", err)
	}
}

func TestOpenMissingKernelFails(t *testing.T) {
	_, err := Open(Config{Dir: t.TempDir(), IPXEDirs: []string{fakeIPXEDir(t)}, Kernel: "/nonexistent/vmlinuz"})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want ErrNotExist", err)
	}
}

func TestTestInitramfsIsNewc(t *testing.T) {
	var b bytes.Buffer
	if err := TestInitramfs(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b.Bytes(), []byte("070701")) || !bytes.Contains(b.Bytes(), []byte("TRAILER!!!")) || b.Len()%4 != 0 {
		t.Fatalf("not a newc archive: %q", b.Bytes()[:min(b.Len(), 120)])
	}
}

// TestOpenLoaders: the Secure Boot loaders are copied under the names
// shim and DHCP use, as KindLoader, only when named.
func TestOpenLoaders(t *testing.T) {
	src := fakeIPXEDir(t)
	shim, grub := filepath.Join(src, "shimx64.efi.signed"), filepath.Join(src, "grubnetx64.efi.signed")
	os.WriteFile(shim, []byte("shim"), 0o644)
	os.WriteFile(grub, []byte("grub"), 0o644)
	c, err := Open(Config{Dir: t.TempDir(), IPXEDirs: []string{src}, LoaderFiles: map[string]string{ShimX64EFI: shim, GrubX64EFI: grub}})
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]string{ShimX64EFI: "shim", GrubX64EFI: "grub"} {
		a, ok := c.Lookup(n)
		if !ok || a.Kind != KindLoader || KindOf(n) != KindLoader {
			t.Fatalf("%s: %+v %v", n, a, ok)
		}
		if b, _ := os.ReadFile(a.Path); string(b) != want {
			t.Errorf("%s = %q", n, b)
		}
	}
	c, err = Open(Config{Dir: t.TempDir(), IPXEDirs: []string{src}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Has(ShimX64EFI) || c.Has(GrubX64EFI) {
		t.Error("loaders in a catalog that named none")
	}
}
