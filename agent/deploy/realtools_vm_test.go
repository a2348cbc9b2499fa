package deploy

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/images/discovery"
	"github.com/corralhq/corral/testsupport/require"
)

// realTools are the programs TestDeployRealTools and TestDeployLoopDevice
// run: the deployer's and the checks'.
var realTools = []string{"losetup", "mdadm", "lvm", "mke2fs", "mkswap", "mkfs.vfat", "blkid", "e2fsck", "debugfs"}

// TestDeployRealToolsInVM runs TestDeployLoopDevice and
// TestDeployRealTools under Debian's kernel in QEMU when the running
// kernel cannot (a microVM's or a container's kernel without md,
// device-mapper or partition tables, and without modules to load): the
// layouts then meet the real tools and a real kernel on such a CI machine
// too. The guest is an initramfs of busybox, the host's tools with their
// libraries, the kernel's loop, md, dm and vfat modules (the seed is
// mounted) and this package's test binary, run as root by /init; it
// fails on a test's failure or skip and on a loop device, array or
// device-mapper table left behind.
func TestDeployRealToolsInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: boots a VM")
	}
	if gaps := kernelGaps(); len(gaps) == 0 {
		t.Skip("the running kernel has md, raid10, device-mapper and partition tables: TestDeployRealTools runs on it directly")
	}
	require.Tool(t, append([]string{"qemu-system-x86_64", "/bin/busybox", "go", "ldd", "apt-cache", "apt-get", "dpkg-deb", "depmod"}, realTools...)...)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")

	// Debian's kernel and its modules (the discovery image's, from apt's
	// cache when it has it).
	k, err := discovery.ResolveKernel(ctx, discovery.MetaPackage)
	if err != nil {
		require.Missing(t, "Debian's kernel package: %v", err)
	}
	debs := filepath.Join(dir, "debs")
	if os.Geteuid() == 0 {
		debs = "/var/cache/corral/images/debs"
	}
	kdir := filepath.Join(dir, "kernel")
	if _, err := discovery.FetchKernel(ctx, k, debs, kdir); err != nil {
		require.Missing(t, "Debian's kernel package: %v", err)
	}
	rel := k.Release()
	vmlinuz := filepath.Join(kdir, "boot", "vmlinuz-"+rel)
	mods := filepath.Join(kdir, "lib/modules", rel)
	for _, m := range []string{"kernel/drivers/block/loop.ko", "kernel/drivers/md/md-mod.ko", "kernel/drivers/md/raid1.ko", "kernel/drivers/md/raid10.ko", "kernel/drivers/md/dm-mod.ko",
		"kernel/fs/fat/fat.ko", "kernel/fs/fat/vfat.ko", "kernel/fs/nls/nls_cp437.ko", "kernel/fs/nls/nls_ascii.ko", "kernel/fs/nls/nls_utf8.ko"} {
		// Plain .ko (Debian 12): busybox's modprobe loads them.
		copyInto(t, filepath.Join(mods, m), filepath.Join(root, "lib/modules", rel, m))
	}
	for _, f := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		copyInto(t, filepath.Join(mods, f), filepath.Join(root, "lib/modules", rel, f))
	}
	vmMust(ctx, t, "", "depmod", "-b", root, rel)

	// busybox, the tools and their libraries, this package's tests.
	copyInto(t, "/bin/busybox", filepath.Join(root, "bin/busybox"))
	for _, l := range []string{"bin/sh", "sbin/modprobe"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, l)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/bin/busybox", filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range realTools {
		path, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		copyInto(t, path, filepath.Join(root, "usr/sbin", tool))
		out, err := exec.CommandContext(ctx, "ldd", path).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", path, err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				copyInto(t, f, filepath.Join(root, f))
			}
		}
	}
	copyInto(t, "/etc/mke2fs.conf", filepath.Join(root, "etc/mke2fs.conf"))
	test := filepath.Join(root, "deploy.test")
	build := exec.CommandContext(ctx, "go", "test", "-c", "-o", test, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ci := "false"
	if require.CI() {
		ci = "true" // a missing precondition inside fails there too
	}
	init := `#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
$B mount -t tmpfs tmp /tmp
$B mkdir -p /run/lvm /run/lock/lvm /run/mdadm
$B ip link set lo up
for m in loop md_mod raid1 raid10 dm_mod vfat nls_cp437 nls_ascii nls_utf8; do $B modprobe $m || echo "corral-vm: modprobe $m failed"; done
cd /tmp
CI=` + ci + ` PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp /deploy.test -test.v -test.count=1 -test.run '^(TestDeployLoopDevice|TestDeployRealTools)$'
echo "corral-vm: exit $?"
echo "corral-vm: left: $(losetup -a | $B wc -l) loop, $($B grep -c ^md /proc/mdstat) md, $($B ls /dev/mapper | $B grep -vc ^control$) dm"
$B poweroff -f
`
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(init), 0o755); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	vmMust(ctx, t, root, "/bin/busybox", "sh", "-c", "find . | /bin/busybox cpio -o -H newc > "+initrd)
	prepared := time.Since(start)

	// The guest (TCG, as the virtual rack's machines: no KVM assumed).
	console := filepath.Join(dir, "console.log")
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "1536", "-smp", "2",
		"-nodefaults", "-display", "none", "-no-reboot", "-serial", "file:"+console,
		"-kernel", vmlinuz, "-initrd", initrd, "-append", "console=ttyS0 quiet panic=-1")
	if out, err := qemu.CombinedOutput(); err != nil {
		t.Errorf("qemu: %v\n%s", err, out)
	}
	log, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(log))
	for sc.Scan() {
		if l := strings.TrimRight(sc.Text(), "\r"); !strings.HasPrefix(strings.TrimSpace(l), "[") && l != "" {
			lines = append(lines, l) // the kernel's lines left out
		}
	}
	out := strings.Join(lines, "\n")
	t.Logf("the guest:\n%s", out)
	for _, want := range []string{"--- PASS: TestDeployLoopDevice/mbr", "--- PASS: TestDeployLoopDevice/gpt",
		"--- PASS: TestDeployRealTools/raid10", "--- PASS: TestDeployRealTools/lvm", "corral-vm: exit 0", "corral-vm: left: 0 loop, 0 md, 0 dm"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest did not say %q", want)
		}
	}
	t.Logf("prepared in %.1f s (kernel, tools, go test -c, initramfs), the guest ran in %.1f s", prepared.Seconds(), (time.Since(start) - prepared).Seconds())
}

// copyInto copies the file at src (symlinks followed) to dst, keeping its
// mode, once.
func copyInto(t *testing.T, src, dst string) {
	t.Helper()
	if _, err := os.Lstat(dst); err == nil {
		return
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func vmMust(ctx context.Context, t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
