package vm

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
	var w cpioWriter
	w.dir("dev")
	w.node("dev/console", 0o020600, 5, 1)
	w.dir("modules")
	initBytes, _ := os.ReadFile(bin)
	w.file("init", 0o100755, initBytes)
	for _, m := range guestModules {
		p, ok := found[m]
		if !ok {
			t.Fatalf("module %s not in %s (compressed modules are not supported here)", m, moduleRoot)
		}
		b, _ := os.ReadFile(p)
		w.file("modules/"+m+".ko", 0o100644, b)
	}
	if err := os.WriteFile(dst, w.close(), 0o600); err != nil {
		t.Fatal(err)
	}
}

type cpioWriter struct {
	buf bytes.Buffer
	ino int
}

func (w *cpioWriter) entry(name string, mode uint32, data []byte, major, minor int) {
	w.ino++
	fmt.Fprintf(&w.buf, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		w.ino, mode, 0, 0, 1, 0, len(data), 0, 0, major, minor, len(name)+1, 0)
	w.buf.WriteString(name)
	w.buf.WriteByte(0)
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}

func (w *cpioWriter) dir(name string)                         { w.entry(name, 0o040755, nil, 0, 0) }
func (w *cpioWriter) file(name string, mode uint32, b []byte) { w.entry(name, mode, b, 0, 0) }
func (w *cpioWriter) node(name string, mode uint32, major, minor int) {
	w.entry(name, mode, nil, major, minor)
}

func (w *cpioWriter) close() []byte {
	w.entry("TRAILER!!!", 0, nil, 0, 0)
	return w.buf.Bytes()
}
