package install

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/require"
	"golang.org/x/sys/unix"
)

// TestInstallLoopDevice runs the real installer (BLKRRPART, mke2fs,
// mount) on a loop device. It needs root, losetup and mke2fs.
func TestInstallLoopDevice(t *testing.T) {
	require.Root(t, "loop devices, mount")
	if _, err := Mke2fs(""); err != nil {
		require.Missing(t, "mke2fs not installed (apt-get install e2fsprogs)")
	}
	require.Tool(t, "losetup")
	if kernelLacksGPT() {
		require.KernelLacks(t, "GPT parsing (CONFIG_EFI_PARTITION is not set)")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 * mib)
	f.Close()
	out, err := exec.Command("losetup", "-P", "-f", "--show", img).CombinedOutput()
	if err != nil {
		require.Missing(t, "no loop device available: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	name := filepath.Base(dev)

	in := New(Config{TempDir: t.TempDir()})
	p := newPKI(t, "node-1")
	var rec recorder
	if err := install(in, p, dev, "inst-1", false, &rec); err != nil {
		t.Fatalf("Install: %v (progress %v)", err, rec.ps)
	}
	part, _ := findPartition("/", name, 1)
	if part == "" {
		t.Fatalf("no partition 1 of %s in sysfs", name)
	}
	if out, err := exec.Command("blkid", "-p", "-o", "export", "/dev/"+part).CombinedOutput(); err == nil {
		for _, want := range []string{"TYPE=ext4", "LABEL=" + PartitionName, "PART_ENTRY_NAME=" + PartitionName} {
			if !strings.Contains(string(out), want) {
				t.Errorf("blkid of /dev/%s lacks %s:\n%s", part, want, out)
			}
		}
	}
	mnt := t.TempDir()
	if err := unix.Mount("/dev/"+part, mnt, "ext4", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{NodeKeyFile, NodeCertFile, CACertFile} {
		if _, err := os.Stat(filepath.Join(mnt, IdentityDir, f)); err != nil {
			t.Error(err)
		}
	}
	a, err := ReadAppliance(mnt)
	if err != nil || a.InstallID != "inst-1" || a.NodeName != "node-1" {
		t.Errorf("appliance.json = %+v, %v", a, err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}

	// Re-run of the same install: allowed, filesystem kept.
	rec = recorder{}
	if err := install(in, p, name, "inst-1", false, &rec); err != nil {
		t.Fatalf("re-run: %v", err)
	}
	if d := rec.ps[2].GetDetail(); !strings.HasPrefix(d, "kept") {
		t.Errorf("format step of the re-run = %q, want kept", d)
	}
	// Another install is refused without wipe.
	if err := install(in, p, name, "inst-2", false, &rec); err == nil {
		t.Fatal("another install over the data disk without wipe succeeded")
	}
	// Wipe: the partition goes away.
	if err := in.Wipe(context.Background(), &nodev1.WipePlan{Disk: dev, InstallId: "w"}, rec.add); err != nil {
		t.Fatal(err)
	}
	if part, _ := findPartition("/", name, 1); part != "" {
		t.Errorf("partition %s still present after wipe", part)
	}
}

// kernelLacksGPT reports whether /proc/config.gz says the running kernel
// was built without GPT support.
func kernelLacksGPT() bool {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return false
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(z)
	return bytes.Contains(b, []byte("# CONFIG_EFI_PARTITION is not set"))
}

// TestKernelFormatMount runs the real mke2fs, mount and identity writer on
// a loop device (no partition table: it works where the kernel cannot
// parse GPTs). It needs root, losetup and mke2fs.
func TestKernelFormatMount(t *testing.T) {
	require.Root(t, "loop devices, mount")
	if _, err := Mke2fs(""); err != nil {
		require.Missing(t, "mke2fs not installed (apt-get install e2fsprogs)")
	}
	require.Tool(t, "losetup")
	img := filepath.Join(t.TempDir(), "part.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(32 * mib)
	f.Close()
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	if err != nil {
		require.Missing(t, "no loop device available: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })

	k := kernel{}
	if err := k.mkfs(context.Background(), dev, PartitionName); err != nil {
		t.Fatal(err)
	}
	c, err := Probe(dev, 32*mib, 512)
	if err != nil || c.String() != "an ext4 filesystem" {
		t.Errorf("after mkfs the device holds %q (%v), want an ext4 filesystem", c, err)
	}
	in := New(Config{TempDir: t.TempDir()})
	p := newPKI(t, "node-1")
	key, err := newNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := key.request("node-1")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := p.sign(context.Background(), csr)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.withMounted(dev, func(dir string) error {
		return writeIdentity(dir, plan(p, "", "inst-1", false), key.pem, certPEM, now)
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("blkid", "-p", "-o", "export", dev).CombinedOutput(); err == nil && !strings.Contains(string(out), "LABEL="+PartitionName) {
		t.Errorf("blkid of %s lacks the label:\n%s", dev, out)
	}
	var got Appliance
	if err := in.withMounted(dev, func(dir string) error {
		got, err = ReadAppliance(dir)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got.InstallID != "inst-1" || got.Endpoint != "10.0.0.1:20180" {
		t.Errorf("appliance.json read back = %+v", got)
	}
}
