package images

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRegisterDiscover(t *testing.T) {
	src := fakeIPXEDir(t)
	dir := filepath.Join(t.TempDir(), "images")
	built := t.TempDir()
	k, i := filepath.Join(built, "vmlinuz"), filepath.Join(built, "initrd.img")
	os.WriteFile(k, []byte("real kernel"), 0o644)
	os.WriteFile(i, []byte("real initramfs"), 0o644)

	// Nothing registered: the stand-ins.
	if c := (Config{Dir: dir}).WithBuiltDiscover(); c.Kernel != "" || c.Initrd != "" {
		t.Fatalf("unregistered: %+v", c)
	}
	cat, b, err := RegisterDiscover(Config{Dir: dir, IPXEDirs: []string{src}}, k, i, "6.1.0-test", "key")
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := cat.Lookup(DiscoverInitrd); a.Size != int64(len("real initramfs")) || a.SHA256 != b.InitrdSHA256 {
		t.Errorf("catalog initrd = %+v, manifest %+v", a, b)
	}
	// What corrald serve does: Open with no explicit kernel/initrd.
	cat, err = Open(Config{Dir: dir, IPXEDirs: []string{src}}.WithBuiltDiscover())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{DiscoverKernel: "real kernel", DiscoverInitrd: "real initramfs"} {
		a, _ := cat.Lookup(name)
		got, _ := os.ReadFile(a.Path)
		if string(got) != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	// An explicit --boot-kernel/--boot-initrd wins.
	if c := (Config{Dir: dir, Initrd: "/x"}).WithBuiltDiscover(); c.Kernel != "" || c.Initrd != "/x" {
		t.Errorf("explicit initrd overridden: %+v", c)
	}
	// The registered files gone: back to the stand-ins.
	os.Remove(filepath.Join(dir, b.Initrd))
	if c := (Config{Dir: dir}).WithBuiltDiscover(); c.Kernel != "" {
		t.Errorf("stale manifest used: %+v", c)
	}
}

func TestRegisterHypervisor(t *testing.T) {
	src := fakeIPXEDir(t)
	dir := filepath.Join(t.TempDir(), "images")
	built := t.TempDir()
	k, i, h := filepath.Join(built, "vmlinuz"), filepath.Join(built, "initrd.img"), filepath.Join(built, "hv.img")
	os.WriteFile(k, []byte("real kernel"), 0o644)
	os.WriteFile(i, []byte("real initramfs"), 0o644)
	os.WriteFile(h, []byte("hypervisor initramfs"), 0o644)
	cfg := Config{Dir: dir, IPXEDirs: []string{src}}

	// No discovery image registered: refused (the profile shares its kernel).
	if _, _, err := RegisterHypervisor(cfg, h, "6.1.0-test", "hkey"); !errors.Is(err, ErrKernelMismatch) {
		t.Fatalf("without discovery image: %v, want ErrKernelMismatch", err)
	}
	if _, _, err := RegisterDiscover(cfg, k, i, "6.1.0-test", "key"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RegisterHypervisor(cfg, h, "6.1.0-other", "hkey"); !errors.Is(err, ErrKernelMismatch) {
		t.Fatalf("other kernel: %v, want ErrKernelMismatch", err)
	}
	cat, b, err := RegisterHypervisor(cfg, h, "6.1.0-test", "hkey")
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := cat.Lookup(HypervisorInitrd); !ok || a.Size != int64(len("hypervisor initramfs")) || a.SHA256 != b.InitrdSHA256 || a.Kind != KindInitrd {
		t.Errorf("catalog hypervisor initrd = %+v, manifest %+v", a, b)
	}
	sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if !strings.Contains(string(sums), b.InitrdSHA256+"  "+HypervisorInitrd) {
		t.Errorf("SHA256SUMS lacks the hypervisor initrd:\n%s", sums)
	}
	// What corrald serve does.
	cat, err = Open(Config{Dir: dir, IPXEDirs: []string{src}}.WithBuiltDiscover())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{DiscoverKernel: "real kernel", HypervisorInitrd: "hypervisor initramfs"} {
		a, _ := cat.Lookup(name)
		if got, _ := os.ReadFile(a.Path); string(got) != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	// Re-registering the same discovery image keeps the hypervisor image.
	if cat, _, err = RegisterDiscover(cfg, k, i, "6.1.0-test", "key"); err != nil || !cat.Has(HypervisorInitrd) {
		t.Errorf("hypervisor image dropped by RegisterDiscover (err %v)", err)
	}
	// A discovery image of another kernel: the hypervisor image no longer
	// matches its kernel and leaves the catalog.
	if cat, _, err = RegisterDiscover(cfg, k, i, "6.1.0-new", "key2"); err != nil || cat.Has(HypervisorInitrd) {
		t.Errorf("stale hypervisor image kept with a new kernel (err %v)", err)
	}
	if c := (Config{Dir: dir}).WithBuiltDiscover(); c.HypervisorInitrd != "" {
		t.Errorf("stale hypervisor image offered: %+v", c)
	}
	// An explicit kernel: no registered hypervisor image (its modules
	// would not match).
	os.WriteFile(filepath.Join(dir, DiscoverManifest), []byte(`{}`), 0o644)
	if c := (Config{Dir: dir, Kernel: k}).WithBuiltDiscover(); c.HypervisorInitrd != "" {
		t.Errorf("hypervisor image with an explicit kernel: %+v", c)
	}
}
