package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/corralhq/corral/testsupport/require"
)

// AAVMF is Debian's arm64 UEFI firmware (qemu-efi-aarch64).
const (
	aavmfCode = "/usr/share/AAVMF/AAVMF_CODE.fd"
	aavmfVars = "/usr/share/AAVMF/AAVMF_VARS.fd"
)

// TestARM64Discovery: `corrald images build --arch arm64` registers the
// arm64 discovery image (Debian's arm64 kernel, u-root and corral-node
// for GOARCH=arm64) and GRUB's arm64 network loader; `corrald serve`
// answers an arm64 QEMU machine's AAVMF firmware PXE (option 93 arch 11)
// with the loader over TFTP and the per-machine GRUB config's URL in
// option 17; GRUB loads the kernel and initramfs over HTTP, the arm64
// agent starts, loads virtio_pci and virtio_net, leases and registers:
// the machine is INVENTORIED with architecture arm64 and Debian's arm64
// kernel in its facts. Accepted, it installs and boots the arm64
// hypervisor image with kexec_load, whose node registers as arm64: the
// machine is DEPLOYED. The guest's
// serial console is kept in $CORRAL_TEST_ARTIFACTS when that is set.
// About 4 minutes under TCG with the images cached (bench/README.md,
// "arm64").
func TestARM64Discovery(t *testing.T) {
	need(t, "ip", "qemu-system-aarch64", "grub-mkimage")
	require.File(t, aavmfCode, "Debian's qemu-efi-aarch64 (AAVMF)")
	require.File(t, "/usr/lib/grub/arm64-efi/efinet.mod", "Debian's grub-efi-arm64-bin (dpkg --add-architecture arm64)")
	l := newLab(t)
	data := filepath.Join(l.dir, "data")

	t0 := time.Now()
	// The arm64 hypervisor leg (accept → install → reboot → GRUB → the
	// arm64 hypervisor image → node READY); CORRAL_E2E_ARM64_HYPERVISOR=0
	// stops at INVENTORIED.
	hyp := os.Getenv("CORRAL_E2E_ARM64_HYPERVISOR") != "0"
	build := []string{"images", "build", "--arch", "arm64", "--data-dir", data, "--image-cache", imageCache(), "--source", srcDir}
	if !hyp {
		build = append(build, "--no-hypervisor")
	}
	out, err := exec.Command(filepath.Join(binDir, "corrald"), build...).CombinedOutput()
	if err != nil {
		t.Fatalf("corrald images build --arch arm64: %v\n%s", err, out)
	}
	t.Logf("corrald images build --arch arm64 (%s):\n%s", time.Since(t0).Round(100*time.Millisecond), out)
	if hyp {
		// The node's guests boot from their disks through the UEFI
		// firmware the image carries (hypervisor/vm DefaultARM64Firmware).
		img := filepath.Join(data, "images", "hypervisor-initrd-arm64.img")
		f, err := os.Open(img)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytesReaderAt(t, lz4.NewReader(f))))
		f.Close()
		if err != nil {
			t.Fatalf("read %s: %v", img, err)
		}
		if !slices.ContainsFunc(recs, func(r cpio.Record) bool {
			return r.Name == "usr/share/qemu-efi-aarch64/QEMU_EFI.fd" && r.FileSize == 2<<20
		}) {
			t.Errorf("%s holds no usr/share/qemu-efi-aarch64/QEMU_EFI.fd of 2 MiB", img)
		}
	}

	// The amd64 profile is the catalog's stand-ins (no amd64 image is
	// built here): --allow-test-images.
	c := startCorrald(t, l.dir, l.ns, data, "--allow-test-images", "--api-listen", l.subnet+".1:20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")

	vars := l.varsCopy(aavmfVars, "AAVMF_VARS.fd")
	mac := fmt.Sprintf("52:54:00:%s:%s:a4", l.id[:2], l.id[2:4])
	const serialA64 = "SN-E2E-ARM64"
	// TCG, one virtio NIC without an option ROM (the firmware's own PXE),
	// one disk for the install; 2 GiB, as the hypervisor image runs from
	// RAM.
	args := []string{"qemu-system-aarch64", "-M", "virt", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "2048", "-smp", "2",
		"-nographic", "-serial", "stdio", "-monitor", "none",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + aavmfCode,
		"-drive", "if=pflash,format=raw,unit=1,file=" + vars,
		"-smbios", fmt.Sprintf("type=1,serial=%s,manufacturer=%s,product=ARM Box 1", serialA64, vendor),
		"-netdev", "tap,id=n0,ifname=" + l.tap("t"+l.id[:4]+"r") + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + mac}
	args = append(args, disks(t, l.dir, "A64-DISK")...)
	t0 = time.Now()
	vm := start(t, l.dir, "console-arm64.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	t.Cleanup(func() {
		if d := os.Getenv("CORRAL_TEST_ARTIFACTS"); d != "" {
			os.WriteFile(filepath.Join(d, "console-arm64.log"), []byte(vm.console.String()), 0o644)
		}
	})
	// Firmware PXE → GRUB → kernel and initramfs over HTTP → the arm64
	// agent running as the image's uinit.
	deadline := time.Now().Add(2 * bootTimeout)
	for !strings.Contains(vm.console.String(), "corral: discovery agent") {
		select {
		case <-vm.done:
			t.Fatalf("VM exited before the agent started; console:\n%s", tail(vm.console.String(), 6<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the arm64 agent did not start within %s; console:\n%s", 2*bootTimeout, tail(vm.console.String(), 6<<10))
		}
		time.Sleep(time.Second)
	}
	t.Logf("arm64 (AAVMF PXE, GRUB, HTTP) power-on to the agent's start: %s", time.Since(t0).Round(time.Second))
	tl, _ := c.cli("machine", "timeline", "m-"+strings.ReplaceAll(mac, ":", ""))
	for _, want := range []string{"grubnetaa64.efi", "GRUB config (arm64)", "vmlinuz-arm64", "initrd-arm64.img"} {
		if !strings.Contains(string(tl), want) {
			t.Errorf("timeline does not mention %q:\n%s", want, tl)
		}
	}
	m := c.waitMachine(vm, 2*bootTimeout, "with serial "+serialA64+" INVENTORIED", func(m machine) bool {
		return m.Serial == serialA64 && m.State == "INVENTORIED"
	})
	t.Logf("arm64 power-on to INVENTORIED: %s", time.Since(t0).Round(time.Second))
	if m.Facts.Architecture != "arm64" {
		t.Errorf("facts.architecture = %q, want arm64", m.Facts.Architecture)
	}
	if !strings.HasSuffix(m.Facts.Kernel, "-arm64") {
		t.Errorf("facts.kernel = %q, want Debian's arm64 kernel", m.Facts.Kernel)
	}
	if m.BootMAC != mac {
		t.Errorf("boot_mac = %q, want %s", m.BootMAC, mac)
	}

	if !hyp {
		vm.stop(t)
		return
	}
	// Accepted, the arm64 discovery agent installs (the arm64 mke2fs the
	// image carries) and boots the arm64 hypervisor image with kexec_load
	// (Debian 12's arm64 kernel has no kexec_file_load), whose
	// corral-node registers its node, which says arm64.
	t1 := time.Now()
	if out, err := c.cli("machine", "accept", m.Name); err != nil {
		t.Fatalf("corral machine accept: %v\n%s", err, out)
	}
	c.waitMachine(vm, 2*bootTimeout, m.Name+" DEPLOYED (its arm64 hypervisor node READY)", func(x machine) bool {
		return x.Name == m.Name && x.State == "DEPLOYED"
	})
	t.Logf("arm64 accept to DEPLOYED (install, kexec, hypervisor READY): %s", time.Since(t1).Round(time.Second))
	con := vm.console.String()
	if !strings.Contains(con, "corral: kexec: loaded with kexec_load (arm64 Image)") || strings.Count(con, "Linux version") != 2 {
		t.Errorf("the hypervisor kernel was not kexec'd from the discovery kernel (%d kernels booted); console:\n%s", strings.Count(con, "Linux version"), tail(con, 6<<10))
	}
	tl, _ = c.cli("machine", "timeline", m.Name)
	if !strings.Contains(string(tl), "hypervisor-initrd-arm64.img") {
		t.Errorf("the timeline does not show the arm64 hypervisor image served:\n%s", tl)
	}
	nodes, err := c.cli("get", "nodes", "-o", "json")
	if err != nil || !regexp.MustCompile(`"corral/node/architecture":\s*"arm64"`).Match(nodes) {
		t.Errorf("corral get nodes (err %v) shows no arm64 node:\n%s", err, nodes)
	}
	vm.stop(t)
}

// bytesReaderAt reads r whole (cpio's reader wants an io.ReaderAt).
func bytesReaderAt(t *testing.T, r io.Reader) io.ReaderAt {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}
