package guestimage

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/testsupport/require"
)

// TestTinyBoots builds (or reuses) the tiny image and boots it under plain
// QEMU (TCG, user-mode network off) with a NoCloud seed on a virtio-scsi
// CD-ROM: the init must apply hostname, user, key and address, and a
// second Tiny call must hit the cache.
func TestTinyBoots(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and boots a guest")
	}
	require.Tool(t, append(TinyTools, "qemu-system-x86_64")...)
	cache, err := CacheDir()
	if err != nil {
		require.Missing(t, "no cache directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := Tiny(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(img.Path)
	t.Logf("tiny image %s (%d KiB, cached=%v) in %v", img.Path, st.Size()>>10, img.Cached, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	again, err := Tiny(ctx, cache)
	if err != nil || !again.Cached || again.Path != img.Path {
		t.Fatalf("second Tiny: %+v %v", again, err)
	}
	t.Logf("second Tiny (cache hit) in %v", time.Since(start).Round(time.Millisecond))

	dir := t.TempDir()
	seed := cloudinit.Seed{InstanceID: "iid-1", Hostname: "tiny-one", User: "n0user",
		SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey test@corral"},
		NICs: []cloudinit.NIC{{MAC: "52:54:00:12:34:56", Addresses: []netip.Prefix{netip.MustParsePrefix("10.9.8.7/24")},
			Gateway4: netip.MustParseAddr("10.9.8.1")}}}
	f, err := os.Create(filepath.Join(dir, "seed.iso"))
	if err != nil {
		t.Fatal(err)
	}
	if err := seed.WriteISO(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	overlay := filepath.Join(dir, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", img.Path, "-F", "qcow2", overlay).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	console := filepath.Join(dir, "console.log")
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "256M",
		"-chardev", "file,id=s0,path="+console, "-serial", "chardev:s0",
		"-drive", "if=none,id=d0,format=qcow2,file="+overlay, "-device", "virtio-blk-pci,drive=d0,bootindex=1",
		"-device", "virtio-scsi-pci,id=scsi0",
		"-drive", "if=none,id=seed,format=raw,readonly=on,file="+filepath.Join(dir, "seed.iso"), "-device", "scsi-cd,bus=scsi0.0,drive=seed",
		"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56")
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { qemu.Process.Kill(); qemu.Wait() }()
	start = time.Now()
	want := []string{
		"CORRAL-TINY hostname=tiny-one instance-id=iid-1",
		"CORRAL-TINY user=n0user uid=1000 keys=1",
		"CORRAL-TINY address dev=eth0 mac=52:54:00:12:34:56 addr=10.9.8.7/24",
		"CORRAL-TINY route dev=eth0 to=0.0.0.0/0 via=10.9.8.1",
		"CORRAL-TINY cloud-init done",
	}
	for time.Since(start) < 2*time.Minute {
		b, _ := os.ReadFile(console)
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(string(b), w)
		}
		if ok {
			t.Logf("tiny guest: power-on to init done in %v", time.Since(start).Round(time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := os.ReadFile(console)
	t.Fatalf("console lacks %q; console:\n%s", want, b)
}

// TestARM64TinyBuilds builds (or reuses) the arm64 tiny image and checks
// a second call hits the cache; images/e2e's TestARM64Deploy boots it.
func TestARM64TinyBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads arm64 packages and builds a disk image")
	}
	require.Tool(t, ARM64TinyTools...)
	cache, err := CacheDir()
	if err != nil {
		require.Missing(t, "no cache directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := ARM64Tiny(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(img.Path)
	t.Logf("arm64 tiny image %s (%d KiB, cached=%v) in %v", img.Path, st.Size()>>10, img.Cached, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	again, err := ARM64Tiny(ctx, cache)
	if err != nil || !again.Cached || again.Path != img.Path {
		t.Fatalf("second ARM64Tiny: %+v %v", again, err)
	}
	t.Logf("second ARM64Tiny (cache hit) in %v", time.Since(start).Round(time.Millisecond))
}
