package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/require"
)

// TestARM64Deploy: an arm64 QEMU machine under AAVMF (TCG) is discovered
// as in TestARM64Discovery (firmware PXE, GRUB's arm64 network loader, the
// arm64 discovery image), accepted into a pool, allocated and deployed
// with an arm64 OS image (guestimage.ARM64Tiny: a GPT disk whose ESP holds
// GRUB as \EFI\BOOT\BOOTAA64.EFI, Debian's arm64 cloud kernel and an
// initramfs with a cloud-init subset) with SSH keys, a host name and
// cloud-config user data. The arm64 agent writes it and the seed and
// reboots; the network GRUB gets the local intent and chainloads the
// disk's \EFI\BOOT\BOOTAA64.EFI; the image's GRUB boots its kernel; its
// init reads the CIDATA seed partition, applies it and phones home
// (DEPLOYED). Over SSH with the deploy's key, as Debian's default user,
// the OS shows its host name, the user data's file and an aarch64 kernel.
// The guest's serial console is kept in $CORRAL_TEST_ARTIFACTS when that
// is set.
func TestARM64Deploy(t *testing.T) {
	need(t, append([]string{"ip", "qemu-system-aarch64", "ssh", "ssh-keygen"}, guestimage.ARM64TinyTools...)...)
	require.File(t, aavmfCode, "Debian's qemu-efi-aarch64 (AAVMF)")
	require.File(t, "/usr/lib/grub/arm64-efi/efinet.mod", "Debian's grub-efi-arm64-bin (dpkg --add-architecture arm64)")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cache, err := guestimage.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	tImg := time.Now()
	osImg, err := guestimage.ARM64Tiny(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("arm64 tiny OS image %s (cached %t) in %s", osImg.Path, osImg.Cached, time.Since(tImg).Round(100*time.Millisecond))

	l := newLab(t)
	data := filepath.Join(l.dir, "data")
	t0 := time.Now()
	out, err := exec.Command(filepath.Join(binDir, "corrald"), "images", "build", "--arch", "arm64", "--no-hypervisor",
		"--data-dir", data, "--image-cache", imageCache(), "--source", srcDir).CombinedOutput()
	if err != nil {
		t.Fatalf("corrald images build --arch arm64: %v\n%s", err, out)
	}
	t.Logf("corrald images build --arch arm64: %s", time.Since(t0).Round(100*time.Millisecond))
	c := startCorrald(t, l.dir, l.ns, data, "--allow-test-images", "--api-listen", l.subnet+".1:20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")
	uploaded := make(chan error, 1)
	go func() {
		out, err := c.cli("--timeout", "5m", "osimage", "upload", "tiny-arm64", osImg.Path, "--format", "qcow2")
		if err != nil {
			err = fmt.Errorf("corral osimage upload: %w\n%s", err, out)
		}
		uploaded <- err
	}()

	// TestARM64Discovery's machine with a disk, rebooting (no
	// -no-reboot): the NIC first, then the disk (bootindex).
	vars := l.varsCopy(aavmfVars, "AAVMF_VARS.fd")
	mac := fmt.Sprintf("52:54:00:%s:%s:a5", l.id[:2], l.id[2:4])
	const serial = "SN-E2E-A64DEP"
	disk := filepath.Join(l.dir, "disk0.raw")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 1<<30); err != nil {
		t.Fatal(err)
	}
	args := []string{"qemu-system-aarch64", "-M", "virt", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "768", "-smp", "2",
		"-nographic", "-serial", "stdio", "-monitor", "none",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + aavmfCode,
		"-drive", "if=pflash,format=raw,unit=1,file=" + vars,
		"-smbios", fmt.Sprintf("type=1,serial=%s,manufacturer=%s,product=ARM Box 2", serial, vendor),
		"-netdev", "tap,id=n0,ifname=" + l.tap("t"+l.id[:4]+"d") + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + mac + ",bootindex=1",
		"-drive", "if=none,id=d0,format=raw,file=" + disk,
		"-device", "virtio-blk-pci,drive=d0,serial=A64DEP-DISK,bootindex=2"}
	t0 = time.Now()
	vm := start(t, l.dir, "console-arm64-deploy.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	t.Cleanup(func() {
		if d := os.Getenv("CORRAL_TEST_ARTIFACTS"); d != "" {
			os.WriteFile(filepath.Join(d, "console-arm64-deploy.log"), []byte(vm.console.String()), 0o644)
		}
	})
	m := c.waitMachine(vm, 2*bootTimeout, "with serial "+serial+" INVENTORIED", func(m machine) bool {
		return m.Serial == serial && m.State == "INVENTORIED"
	})
	t.Logf("arm64 power-on to INVENTORIED: %s", time.Since(t0).Round(time.Second))
	if m.Facts.Architecture != "arm64" {
		t.Fatalf("facts.architecture = %q, want arm64", m.Facts.Architecture)
	}

	must := func(args ...string) []byte {
		t.Helper()
		out, err := c.cli(args...)
		if err != nil {
			t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	must("machine", "accept", m.Name, "--target", "pool")
	must("label", "machine", m.Name, "pool=a64")
	c.waitMachine(vm, bootTimeout, m.Name+" READY", func(x machine) bool { return x.Name == m.Name && x.State == "READY" })
	must("machine", "allocate", "--pool", "a64")
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 3*time.Minute, "OS image tiny-arm64 READY", func() bool {
		out, err := c.cli("get", "os_image", "tiny-arm64", "-o", "json")
		return err == nil && strings.Contains(string(out), "OS_IMAGE_STATE_READY")
	})

	keyDir := t.TempDir()
	key := filepath.Join(keyDir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	userData := filepath.Join(keyDir, "user-data")
	if err := os.WriteFile(userData, []byte("#cloud-config\nwrite_files:\n  - path: /etc/corral-deployed\n    content: \"arm64 user data applied\\n\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	must("machine", "deploy", m.Name, "--image", "tiny-arm64", "--ssh-key", key+".pub", "--hostname", "a64-deployed", "--user-data", userData)
	var d struct {
		State       string `json:"state"`
		StateReason string `json:"state_reason"`
		Deployment  struct {
			Address string `json:"address"`
			Error   string `json:"error"`
		} `json:"deployment"`
	}
	deadline := time.Now().Add(6 * time.Minute)
	for {
		if err := json.Unmarshal(must("get", "machine", m.Name, "-o", "json"), &d); err != nil {
			t.Fatal(err)
		}
		if d.State == "DEPLOYED" {
			break
		}
		if d.State == "FAILED" {
			t.Fatalf("deploy FAILED: %s (%s); console:\n%s", d.StateReason, d.Deployment.Error, tail(vm.console.String(), 6<<10))
		}
		select {
		case <-vm.done:
			t.Fatalf("the VM exited while deploying; console:\n%s", tail(vm.console.String(), 6<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not DEPLOYED after 6m (state %s); console:\n%s", d.State, tail(vm.console.String(), 6<<10))
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("deploy → DEPLOYED (written, rebooted, chainloaded from the disk's ESP, phoned home): %s", time.Since(t1).Round(time.Second))

	addr, _, _ := strings.Cut(d.Deployment.Address, "/")
	var sshOut string
	for range 20 {
		b, err := exec.Command("ip", "netns", "exec", l.ns, "ssh", "-i", key,
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
			"-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "debian@"+addr,
			"hostname; cat /etc/corral-deployed; uname -m; id -un").CombinedOutput()
		sshOut = string(b)
		if err == nil {
			break
		}
		sshOut = fmt.Sprintf("ssh debian@%s: %v\n%s", addr, err, b)
		time.Sleep(3 * time.Second)
	}
	t.Logf("power-on → SSH on the deployed arm64 OS: %s; over SSH:\n%s", time.Since(t0).Round(time.Second), sshOut)
	if got := strings.Join(strings.Fields(sshOut), " "); got != "a64-deployed arm64 user data applied aarch64 debian" {
		t.Errorf("over SSH: got %q, want the host name, the user data's file, aarch64 and the default user", got)
	}
	con := vm.console.String()
	for _, want := range []string{"Corral test image: tiny arm64 kernel from the disk's ESP", "CORRAL-TINY seed=/dev/vda", "phone_home http://"} {
		if !strings.Contains(con, want) {
			t.Errorf("the console lacks %q", want)
		}
	}
	// The timeline from the deploy on, in order: written, the local
	// answer to the rebooted machine's GRUB, the phone-home.
	var es []timelineEntry
	if err := json.Unmarshal(must("machine", "timeline", m.Name, "-o", "json", "--limit", "500"), &es); err != nil {
		t.Fatal(err)
	}
	wants := []struct{ source, event, detail string }{
		{"lifecycle", "deploy-written", ""},
		{"http", "script", "rendered local GRUB config (arm64)"},
		{"lifecycle", "deployed", "the OS phoned home"},
	}
	var lines []string
	i := 0
	for _, e := range es {
		if e.At.Before(t1) {
			continue
		}
		lines = append(lines, fmt.Sprintf("+%5.1fs %s %s %s", e.At.Sub(t1).Seconds(), e.Source, e.Event, e.Detail))
		if i < len(wants) && e.Source == wants[i].source && e.Event == wants[i].event && strings.Contains(e.Detail, wants[i].detail) {
			i++
		}
	}
	if i < len(wants) {
		t.Errorf("timeline lacks %+v (in order); from the deploy on:\n%s", wants[i], strings.Join(lines, "\n"))
	} else {
		t.Logf("timeline from the deploy on:\n%s", strings.Join(lines, "\n"))
	}
	vm.stop(t)
}
