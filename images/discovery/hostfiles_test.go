package discovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestResolveHostFilesAndHash(t *testing.T) {
	d := t.TempDir()
	rom := filepath.Join(d, "vgabios-isavga.bin")
	os.WriteFile(rom, []byte("rom v1"), 0o644)
	link := filepath.Join(d, "vgabios.bin")
	os.Symlink("vgabios-isavga.bin", link)
	files, err := resolveHostFiles(context.Background(), []string{link}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0].Src != rom || files[0].Dst != link[1:] {
		t.Fatalf("files = %+v: want the link's path as destination and its target as source", files)
	}
	if _, err := resolveHostFiles(context.Background(), []string{filepath.Join(d, "absent")}, nil); err == nil {
		t.Error("a missing host file was accepted")
	}
	h1, err := hostFilesHash(files)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(rom, []byte("rom v2"), 0o644)
	if h2, _ := hostFilesHash(files); h2 == h1 {
		t.Error("hash unchanged after the file changed")
	}
}

func TestRecipes(t *testing.T) {
	o := Options{Modules: Modules}
	d, err := o.recipe(Discover)
	if err != nil {
		t.Fatal(err)
	}
	h, err := o.recipe(Hypervisor)
	if err != nil {
		t.Fatal(err)
	}
	if d.tag != AgentBuildTag || h.tag != "" {
		t.Errorf("build tags: discover %q, hypervisor %q", d.tag, h.tag)
	}
	if !slices.Equal(h.uinitArgs, []string{"hypervisor", "--boot"}) || !slices.Equal(d.uinitArgs, []string{"discover"}) {
		t.Errorf("uinit args: discover %v, hypervisor %v", d.uinitArgs, h.uinitArgs)
	}
	for _, m := range append([]string{"ext4"}, HypervisorModules...) {
		if !slices.Contains(h.modules, m) {
			t.Errorf("hypervisor modules lack %s", m)
		}
	}
	if !slices.Contains(d.modules, "ext4") || slices.Contains(d.modules, "kvm") {
		t.Errorf("discover modules: %v", d.modules)
	}
	for _, p := range []string{"/usr/sbin/mke2fs", "/usr/bin/qemu-system-x86_64", "/usr/bin/qemu-img"} {
		if !slices.Contains(h.paths, p) {
			t.Errorf("hypervisor image lacks %s", p)
		}
	}
	if !slices.Contains(d.paths, "/usr/sbin/mke2fs") || slices.Contains(d.paths, "/usr/bin/qemu-img") {
		t.Errorf("discover host files: %v", d.paths)
	}
	if !d.pciIDs || h.pciIDs {
		t.Errorf("pci.ids shipped: discover %t, hypervisor %t (only the discovery agent names PCI devices)", d.pciIDs, h.pciIDs)
	}
	if d.maxSize != MaxInitrdSize || h.maxSize != 0 || h.subdir == d.subdir {
		t.Errorf("budgets %d/%d, cache subdirs %q/%q", d.maxSize, h.maxSize, d.subdir, h.subdir)
	}
	if _, err := o.recipe("rescue"); err == nil {
		t.Error("unknown profile accepted")
	}
}
