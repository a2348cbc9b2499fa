package vm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/require"
)

// TestARM64GuestFromDisk: an arm64 node's guest with no kernel boots
// from its disk through the UEFI firmware the node carries (-bios
// QEMU_EFI.fd, Debian's qemu-efi-aarch64): the firmware finds the disk's
// \EFI\BOOT\BOOTAA64.EFI (GRUB), which boots the kernel, whose init reads
// the VM's cloud-init seed from the SCSI CD-ROM the Manager attaches.
// The Manager runs qemu-system-aarch64 under TCG on this host as an arm64
// node would under KVM (Config.Arch). A node without the firmware refuses
// such a VM with the reason, and makes nothing. About 40-90 s under TCG.
func TestARM64GuestFromDisk(t *testing.T) {
	require.Tool(t, "qemu-system-aarch64", "qemu-img", DefaultARM64Firmware)
	require.Tool(t, guestimage.ARM64TinyTools...)
	cache, err := guestimage.CacheDir()
	if err != nil {
		require.Missing(t, "no cache directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := guestimage.ARM64Tiny(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	root := filepath.Join(work, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", img.Path, root).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	spec := Spec{
		Name: "arm1", UUID: "3f2a6c1e-0000-4000-8000-0000000000a6", VCPUs: 1, MemoryBytes: 512 << 20,
		Disks: []Disk{{Volume: "root", Path: root, BootIndex: 1}},
		Seed:  &cloudinit.Seed{InstanceID: "arm1-1", Hostname: "arm-guest-1"},
	}

	// No firmware on the node: refused, no VM directory.
	bare, err := New(ctx, Config{Dir: filepath.Join(work, "bare"), Arch: "arm64", Accel: "tcg", Firmware: filepath.Join(work, "no-QEMU_EFI.fd")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Boot(ctx, spec); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "UEFI firmware") {
		t.Fatalf("Boot without firmware = %v, want a precondition naming the UEFI firmware", err)
	}
	if _, err := os.Stat(filepath.Join(work, "bare", "arm1")); !os.IsNotExist(err) {
		t.Errorf("a refused VM left its directory: %v", err)
	}

	m, err := New(ctx, Config{Dir: filepath.Join(work, "vms"), Arch: "arm64", Accel: "tcg", ShutdownTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	v, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m.Delete(context.Background(), "arm1") })
	waitConsole(t, v.SerialLog, "CORRAL-TINY seed=/dev/sr0", 1, 5*time.Minute)
	waitConsole(t, v.SerialLog, "CORRAL-TINY hostname=arm-guest-1 ", 1, time.Minute)
	t.Logf("arm64 guest from its disk (UEFI, GRUB, kernel) to reading its seed: %v", time.Since(start).Round(time.Second))
	if b, _ := os.ReadFile(v.SerialLog); !strings.Contains(string(b), "aarch64") && !strings.Contains(string(b), "arm64") {
		t.Errorf("console shows no arm64 kernel:\n%s", tail(string(b), 2000))
	}
}
