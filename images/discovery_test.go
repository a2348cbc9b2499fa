package images

import (
	"os"
	"path/filepath"
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
