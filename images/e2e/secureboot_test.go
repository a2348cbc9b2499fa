package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Debian's Secure Boot firmware (ovmf) with Microsoft's keys enrolled, and
// the signed loaders `corrald serve --secure-boot` copies into its catalog.
const (
	ovmfSecbootCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	ovmfMSVars      = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
	shimSigned      = "/usr/lib/shim/shimx64.efi.signed"
	grubNetSigned   = "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed"
)

// hypervisorMB is the Secure Boot machine's memory: the hypervisor image
// it is handed over to runs from RAM.
const hypervisorMB = 2560

// timelineEntry is one entry of `corral machine timeline -o json`.
type timelineEntry struct {
	At         time.Time         `json:"at"`
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Detail     string            `json:"detail"`
	Attributes map[string]string `json:"attributes"`
}

// TestSecureBootDiscovery: OVMF's Secure Boot firmware with Microsoft's
// keys PXE-boots the real discovery image through `corrald serve
// --secure-boot`: Debian's shim (signed by Microsoft) → Debian's signed
// network GRUB → the image's Debian kernel (signed by Debian) and its
// initramfs, all over TFTP, with the GRUB configuration corrald renders
// for the MAC. The agent registers the machine (INVENTORIED) and reports
// Secure Boot on and the kernel locked down (integrity); `corral describe
// machine` and the registration on the timeline say so, and the timeline
// holds the grub-config entry. Accepted, the machine's locked-down agent
// installs and hands over to the hypervisor image with kexec_file_load,
// and the node brings it to DEPLOYED. The tampered-kernel refusal is
// boot/e2e's TestSecureBootChain.
func TestSecureBootDiscovery(t *testing.T) {
	need(t, "ip", "qemu-system-x86_64", ovmfSecbootCode, ovmfMSVars, shimSigned, grubNetSigned)
	image(t)
	l := newLab(t)
	t.Logf("lab namespace %s (corrald and the VM run in it)", l.ns)
	data := filepath.Join(l.dir, "data")
	out, err := exec.Command(filepath.Join(binDir, "corrald"), "images", "build", "--data-dir", data,
		"--image-cache", imageCache(), "--source", srcDir).CombinedOutput()
	if err != nil {
		t.Fatalf("corrald images build: %v\n%s", err, out)
	}
	c := startCorrald(t, l.dir, l.ns, data, "--secure-boot", "--api-listen", l.subnet+".1:20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")

	// A copy of the Microsoft-keys variable store; SMM on, as the secboot
	// build requires; the NIC's iPXE option ROM removed so EDK2's own PXE
	// client boots (the one Secure Boot machines use).
	vars := l.varsCopy(ovmfMSVars, "OVMF_VARS_ms.fd")
	const sbSerial = "SN-E2E-SB"
	mac := fmt.Sprintf("52:54:00:%s:%s:5b", l.id[:2], l.id[2:4])
	tap := l.tap("s" + l.id[:4])
	// The hypervisor image runs from RAM: the virtual rack's memory.
	args := append(qemuBase(hypervisorMB, cpus), "-machine", "q35,smm=on",
		"-global", "driver=cfi.pflash01,property=secure,value=on",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfSecbootCode,
		"-drive", "if=pflash,format=raw,unit=1,file="+vars,
		"-boot", "n", "-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac="+mac,
		"-smbios", "type=1,serial="+sbSerial+",manufacturer=Corral Lab,product=Secure Box")
	args = append(args, disks(t, l.dir, "SB-DISK")...)
	t0 := time.Now()
	vm := start(t, l.dir, "console-sb.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	m := c.waitMachine(vm, bootTimeout, "with serial "+sbSerial+" INVENTORIED", func(m machine) bool {
		return m.Serial == sbSerial && m.State == "INVENTORIED"
	})
	took := time.Since(t0)
	t.Logf("Secure Boot power-on to INVENTORIED: %s", took.Round(time.Second))

	if m.Facts.SecureBoot != "SECURE_BOOT_ENABLED" || m.Facts.Lockdown != "integrity" {
		t.Errorf("facts secure_boot %q lockdown %q, want SECURE_BOOT_ENABLED and integrity", m.Facts.SecureBoot, m.Facts.Lockdown)
	}
	if !strings.Contains(vm.console.String(), "Secure boot enabled") {
		t.Errorf("the kernel did not report Secure Boot on; console:\n%s", tail(vm.console.String(), 4096))
	}
	desc, err := c.cli("describe", "machine", m.Name)
	if err != nil || !strings.Contains(string(desc), "# secure boot: enabled, kernel lockdown integrity") {
		t.Errorf("corral describe machine %s (err %v) lacks its Secure Boot state:\n%s", m.Name, err, desc)
	}

	out, err = c.cli("machine", "timeline", m.Name, "-o", "json", "--limit", "500")
	if err != nil {
		t.Fatalf("corral machine timeline: %v\n%s", err, out)
	}
	var es []timelineEntry
	if err := json.Unmarshal(out, &es); err != nil {
		t.Fatalf("timeline json: %v\n%s", err, out)
	}
	// The chain in order: shim, GRUB, its configuration, the kernel and
	// the initramfs over TFTP, then the registration noting Secure Boot.
	wants := []struct{ source, event, attr, value string }{
		{"dhcp", "offer", "file", "shimx64.efi"},
		{"tftp", "tftp-file", "file", "shimx64.efi"},
		{"tftp", "tftp-file", "file", "grubx64.efi"},
		{"http", "grub-config", "intent", "discover"},
		{"tftp", "tftp-file", "file", "grub/grub.cfg"},
		{"tftp", "tftp-file", "file", "vmlinuz"},
		{"tftp", "tftp-file", "file", "initrd.img"},
		{"inventory", "registered", "secure_boot", "enabled, lockdown integrity"},
	}
	var lines []string
	i := 0
	for _, e := range es {
		lines = append(lines, fmt.Sprintf("+%5.1fs %s %s %s", e.At.Sub(t0).Seconds(), e.Source, e.Event, e.Detail))
		if i < len(wants) && e.Source == wants[i].source && e.Event == wants[i].event && e.Attributes[wants[i].attr] == wants[i].value {
			i++
		}
	}
	if i < len(wants) {
		t.Fatalf("timeline lacks %+v (in order); timeline:\n%s", wants[i], strings.Join(lines, "\n"))
	}
	t.Logf("timeline:\n%s", strings.Join(lines, "\n"))

	// Accepted, the locked-down discovery agent installs and hands over
	// to the hypervisor image by kexec: under lockdown only
	// kexec_file_load, which the kernel allows because the image's
	// kernel carries Debian's signature.
	t1 := time.Now()
	if out, err := c.cli("machine", "accept", m.Name); err != nil {
		t.Fatalf("corral machine accept: %v\n%s", err, out)
	}
	c.waitMachine(vm, bootTimeout, m.Name+" DEPLOYED (its hypervisor node READY)", func(x machine) bool {
		return x.Name == m.Name && x.State == "DEPLOYED"
	})
	t.Logf("accept to DEPLOYED by kexec under Secure Boot: %s", time.Since(t1).Round(time.Second))
	con := vm.console.String()
	if !strings.Contains(con, "corral: kexec: loaded with kexec_file_load (kernel lockdown: integrity)") {
		t.Errorf("the discovery agent did not load the hypervisor kernel with kexec_file_load under lockdown; console:\n%s", tail(con, 6<<10))
	}
	if n := strings.Count(con, "Secure boot enabled"); n < 2 {
		t.Errorf("the hypervisor kernel did not report Secure Boot on (%d kernels did)", n)
	}
}
