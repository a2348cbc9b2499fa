package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/corralhq/corral/images/discovery"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/pierrec/lz4/v4"
	"github.com/u-root/u-root/pkg/cpio"
)

var (
	bothOnce sync.Once
	both     []discovery.Result
	bothErr  error
)

// bothImages builds (or takes from the cache) the discovery and hypervisor
// images once per run.
func bothImages(t *testing.T) (disc, hyp discovery.Result) {
	t.Helper()
	if testing.Short() {
		t.Skip("image chroot tests: skipped with -short (they build both images)")
	}
	require.Root(t, "image chroot tests: chroot, mounts, apt")
	require.Tool(t, "apt-get", "apt-cache", "dpkg-deb", "dpkg-query", "xz", "zstd", "go", "qemu-system-x86_64", "qemu-img")
	bothOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		start := time.Now()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		both, bothErr = discovery.BuildProfiles(ctx, discovery.Options{SourceDir: srcDir, CacheDir: imageCache(), Logger: log}, discovery.Discover, discovery.Hypervisor)
		if bothErr == nil {
			for _, r := range both {
				fmt.Fprintf(os.Stderr, "%s image (cached %v, build %s) ready after %s: initrd %d bytes (%s)\n",
					r.Profile, r.Cached, r.BuildTime.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond), r.InitrdSize, r.Compression)
			}
		}
	})
	if bothErr != nil {
		t.Fatalf("images: %v", bothErr)
	}
	return both[0], both[1]
}

// unpack extracts a built initramfs (zstd, xz, lz4 or gzip) into a new directory.
func unpack(t *testing.T, r discovery.Result) string {
	t.Helper()
	dir := t.TempDir()
	cpioPath := filepath.Join(dir, "initramfs.cpio")
	out, err := os.Create(cpioPath)
	if err != nil {
		t.Fatal(err)
	}
	switch r.Compression {
	case "zstd":
		cmd := exec.Command("zstd", "-dc", r.Initrd)
		cmd.Stdout = out
		if err := cmd.Run(); err != nil {
			t.Fatalf("zstd -d %s: %v", r.Initrd, err)
		}
	case "xz":
		cmd := exec.Command("xz", "-dc", r.Initrd)
		cmd.Stdout = out
		if err := cmd.Run(); err != nil {
			t.Fatalf("xz -d %s: %v", r.Initrd, err)
		}
	case "lz4":
		f, err := os.Open(r.Initrd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, lz4.NewReader(f)); err != nil {
			t.Fatalf("lz4 -d %s: %v", r.Initrd, err)
		}
		f.Close()
	default:
		f, err := os.Open(r.Initrd)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, zr); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	out.Close()
	f, err := os.Open(cpioPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	if err != nil {
		t.Fatalf("read cpio: %v", err)
	}
	root := filepath.Join(dir, "root")
	os.Mkdir(root, 0o755)
	for _, rec := range recs {
		if err := cpio.CreateFileInRoot(rec, root, false); err != nil {
			t.Fatalf("unpack %s: %v", rec.Name, err)
		}
	}
	os.Remove(cpioPath)
	return root
}

// inRoot runs argv chrooted into root with /dev and /proc from the host.
func inRoot(t *testing.T, root string, timeout time.Duration, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/bin:/ubin:/usr/bin:/usr/sbin:/sbin", "HOME=/tmp"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s: %s: %v\n%s", root, strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// mountHostDevs bind-mounts the host's /dev and mounts a proc under root
// (QEMU reads /dev/urandom and /proc); they are detached at cleanup.
func mountHostDevs(t *testing.T, root string) {
	t.Helper()
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
	}{{"/dev", "dev", "", syscall.MS_BIND | syscall.MS_REC}, {"proc", "proc", "proc", 0}} {
		dst := filepath.Join(root, m.dst)
		os.MkdirAll(dst, 0o755)
		if err := syscall.Mount(m.src, dst, m.fstype, m.flags, ""); err != nil {
			t.Fatalf("mount %s on %s: %v", m.src, dst, err)
		}
		t.Cleanup(func() { syscall.Unmount(dst, syscall.MNT_DETACH) })
	}
}

// TestDiscoveryImageMkfs: the discovery image's mke2fs (Debian's, with
// the libraries ldd found) formats an ext4 file system when nothing but
// the image is visible, and the ext4 module chain is staged.
func TestDiscoveryImageMkfs(t *testing.T) {
	disc, _ := bothImages(t)
	if disc.InitrdSize > discovery.MaxInitrdSize {
		t.Fatalf("discovery initrd %d bytes, over %d", disc.InitrdSize, discovery.MaxInitrdSize)
	}
	root := unpack(t, disc)
	t.Logf("discovery image: %d bytes %s", disc.InitrdSize, disc.Compression)
	os.MkdirAll(filepath.Join(root, "tmp"), 0o1777)
	out := inRoot(t, root, time.Minute, "/usr/sbin/mke2fs", "-F", "-t", "ext4", "-L", "corral-data", "/tmp/data.img", "64M")
	if !strings.Contains(out, "Writing superblocks") {
		t.Errorf("mke2fs output:\n%s", out)
	}
	assertExt4(t, root, disc.Release)
}

func assertExt4(t *testing.T, root, release string) {
	t.Helper()
	dep, err := os.ReadFile(filepath.Join(root, "lib/modules", release, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"kernel/fs/ext4/ext4.ko:", "kernel/fs/jbd2/jbd2.ko", "kernel/fs/mbcache.ko", "crc32c_generic.ko"} {
		if !strings.Contains(string(dep), m) {
			t.Errorf("modules.dep lacks %s", m)
		}
	}
}

// TestHypervisorImageRunsQEMU: inside the unpacked hypervisor image (and
// nothing of the host but /dev and /proc) qemu-img creates a qcow2 and
// QEMU starts a VM with exactly the command line the node uses
// (hypervisor/vm.Args: q35, TCG, VGA, VNC, virtio-rng, virtio-scsi with the
// seed CD, virtio-blk on the qcow2, direct kernel boot) plus a virtio-net
// NIC on user networking, runs it for a second over QMP and quits: the
// libraries, the TCG accelerator module, the ROMs and the keymap are
// complete.
func TestHypervisorImageRunsQEMU(t *testing.T) {
	_, hyp := bothImages(t)
	start := time.Now()
	root := unpack(t, hyp)
	t.Logf("hypervisor image: %d bytes %s, unpacked in %s", hyp.InitrdSize, hyp.Compression, time.Since(start).Round(time.Millisecond))
	assertExt4(t, root, hyp.Release)
	dep, _ := os.ReadFile(filepath.Join(root, "lib/modules", hyp.Release, "modules.dep"))
	for _, m := range []string{"/tun.ko:", "/bridge.ko:", "/vhost_net.ko:", "/8021q.ko:", "/kvm.ko:", "/kvm-intel.ko:", "/kvm-amd.ko:"} {
		if !strings.Contains(string(dep), m) {
			t.Errorf("modules.dep lacks %s", m)
		}
	}
	if l, err := os.Readlink(filepath.Join(root, "bin/uinit")); err != nil {
		t.Errorf("no /bin/uinit: %v", err)
	} else {
		t.Logf("/bin/uinit -> %s", l)
	}

	out := inRoot(t, root, time.Minute, "/usr/bin/qemu-img", "--version")
	t.Logf("%s", strings.SplitN(out, "\n", 2)[0])
	vmDir := "/tmp/vm"
	os.MkdirAll(filepath.Join(root, vmDir), 0o755)
	inRoot(t, root, time.Minute, "/usr/bin/qemu-img", "create", "-f", "qcow2", vmDir+"/disk0.qcow2", "64M")
	inRoot(t, root, time.Minute, "/usr/sbin/mke2fs", "-F", "-q", "-t", "ext4", vmDir+"/data.img", "64M")
	p := vm.PathsFor(vmDir)
	os.WriteFile(filepath.Join(root, p.Seed), make([]byte, 2048), 0o644)
	kernel, err := os.ReadFile(hyp.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, vmDir, "vmlinuz"), kernel, 0o644)

	mountHostDevs(t, root)
	spec := vm.Spec{Name: "chroot-probe", UUID: "6f1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b", VCPUs: 1, MemoryBytes: 256 << 20,
		Disks:  []vm.Disk{{Volume: "disk0", Path: vmDir + "/disk0.qcow2", BootIndex: 1}},
		Seed:   &cloudinit.Seed{},
		Kernel: vmDir + "/vmlinuz", Append: "console=ttyS0"}
	args := append([]string{"/usr/bin/qemu-system-x86_64"}, vm.Args(spec, p, vm.TCG, false)...)
	args = append(args, "-netdev", "user,id=u0", "-device", "virtio-net-pci,netdev=u0,id=unic0")
	// -daemonize: QEMU returns once the VM is set up (stopped, -S).
	inRoot(t, root, time.Minute, args...)
	pid := readPID(t, filepath.Join(root, p.PIDFile))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })

	q := dialQMP(t, filepath.Join(root, p.QMP))
	q.do(t, "qmp_capabilities")
	q.do(t, "cont")
	time.Sleep(time.Second)
	st := q.do(t, "query-status")
	if !strings.Contains(st, `"running"`) {
		t.Errorf("query-status after cont: %s", st)
	}
	q.do(t, "quit")
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("QEMU %d still running after quit", pid)
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("QEMU pid file: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 0 {
		t.Fatalf("QEMU pid file %q", b)
	}
	return pid
}

type qmp struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(t *testing.T, sock string) *qmp {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatalf("QMP: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	q := &qmp{c: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if l, err := q.r.ReadString('\n'); err != nil || !strings.Contains(l, "QMP") {
		t.Fatalf("QMP greeting %q: %v", l, err)
	}
	return q
}

// do runs a QMP command and returns its reply line, skipping events.
func (q *qmp) do(t *testing.T, cmd string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"execute": cmd})
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		t.Fatalf("QMP %s: %v", cmd, err)
	}
	for {
		l, err := q.r.ReadString('\n')
		if err != nil {
			t.Fatalf("QMP %s: %v", cmd, err)
		}
		if strings.Contains(l, `"error"`) {
			t.Fatalf("QMP %s: %s", cmd, l)
		}
		if strings.Contains(l, `"return"`) {
			return l
		}
	}
}
