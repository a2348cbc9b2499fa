package vm

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/initramfs"
)

// Tiny test guest: Debian's cloud kernel (downloaded once with apt-get and
// cached) plus an initramfs holding a static Go /init (testdata/tinyinit)
// and the virtio/SCSI/CD-ROM/button modules it loads.

var guestModules = []string{
	"virtio", "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"scsi_common", "scsi_mod", "cdrom", "sr_mod", "virtio_scsi",
	"button", "evdev", "failover", "net_failover", "virtio_net",
}

func cacheDir(t *testing.T) string {
	if d := os.Getenv("CORRAL_TEST_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no cache directory: %v", err)
	}
	return filepath.Join(d, "corral-test")
}

// guestKernel returns the kernel image and the module tree root of the
// cached Debian cloud kernel, downloading it the first time.
func guestKernel(t *testing.T) (string, string) {
	t.Helper()
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("apt-get not available to fetch the guest kernel")
	}
	out, err := exec.Command("apt-cache", "depends", "linux-image-cloud-amd64").Output()
	if err != nil {
		t.Skipf("apt-cache depends linux-image-cloud-amd64: %v", err)
	}
	var pkg string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(v, "linux-image-") {
			pkg = v
			break
		}
	}
	if pkg == "" {
		t.Fatalf("cannot resolve linux-image-cloud-amd64: %s", out)
	}
	dir := filepath.Join(cacheDir(t), pkg)
	if _, err := os.Stat(filepath.Join(dir, "boot")); err != nil {
		dl := t.TempDir()
		cmd := exec.Command("apt-get", "download", pkg)
		cmd.Dir = dl
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get download %s: %v %s", pkg, err, out)
		}
		debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
		if len(debs) != 1 {
			t.Fatalf("downloaded %v", debs)
		}
		tmp := dir + ".tmp"
		os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("dpkg-deb", "-x", debs[0], tmp).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -x: %v %s", err, out)
		}
		if err := os.Rename(tmp, dir); err != nil {
			t.Fatal(err)
		}
	}
	kernels, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		t.Fatalf("kernel images in %s: %v", dir, kernels)
	}
	return kernels[0], filepath.Join(dir, "lib", "modules")
}

// buildInitramfs compiles tinyinit and writes a newc cpio with /init,
// /dev/console and the modules.
func buildInitramfs(t *testing.T, moduleRoot, dst string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "init")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/tinyinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build tinyinit: %v %s", err, out)
	}
	found := map[string]string{}
	filepath.WalkDir(moduleRoot, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			found[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return nil
	})
	var cpioBuf bytes.Buffer
	w := initramfs.NewWriter(&cpioBuf)
	w.Dir("dev")
	w.CharDev("dev/console", 0o600, 5, 1)
	w.Dir("modules")
	initBytes, _ := os.ReadFile(bin)
	w.File("init", 0o100755, initBytes)
	for _, m := range guestModules {
		p, ok := found[m]
		if !ok {
			t.Fatalf("module %s not in %s (compressed modules are not supported here)", m, moduleRoot)
		}
		b, _ := os.ReadFile(p)
		w.File("modules/"+m+".ko", 0o100644, b)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, cpioBuf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}
