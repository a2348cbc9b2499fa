package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

// Debian's Secure Boot firmware (ovmf) with Microsoft's keys enrolled.
const (
	ovmfSecbootCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	ovmfMSVars      = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
)

// secureBootVM boots a q35 machine on OVMF's Secure Boot firmware with a
// copy of the Microsoft-keys variable store, its NIC's option ROM removed
// (EDK2's own PXE client).
func secureBootVM(t *testing.T, l *lab, mac, tap string) *vm {
	t.Helper()
	b, err := os.ReadFile(ovmfMSVars)
	if err != nil {
		t.Fatal(err)
	}
	vars := filepath.Join(l.dir, "OVMF_VARS_ms-"+strings.ReplaceAll(mac, ":", "")+".fd")
	if err := os.WriteFile(vars, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return l.vm(vmOpts{uefi: true, code: ovmfSecbootCode, vars: vars, nic: "virtio-net-pci", noROM: true, mac: mac, tap: l.tap(tap)})
}

// secureBootChain is the timeline of the signed chain up to the kernel:
// DHCP gives shimx64.efi, shim fetches grubx64.efi, GRUB its
// configuration and the kernel, all over TFTP.
var secureBootChain = []want{
	{"dhcp", "discover", map[string]string{"arch": "7", "ipxe": ""}},
	{"dhcp", "offer", map[string]string{"boot": "tftp", "file": `shimx64\.efi`}},
	{"tftp", "tftp-file", map[string]string{"file": `shimx64\.efi`, "bytes": `[1-9]\d+`}},
	{"tftp", "tftp-file", map[string]string{"file": `grubx64\.efi`, "bytes": `[1-9]\d+`}},
	{"http", "grub-config", map[string]string{"intent": "discover", "kernel": "vmlinuz", "initrd": "initrd.img"}},
	{"tftp", "tftp-file", map[string]string{"file": `grub/grub\.cfg`}},
	{"tftp", "tftp-file", map[string]string{"file": `vmlinuz`, "bytes": `[1-9]\d+`}},
}

// TestSecureBootChain: OVMF's Secure Boot firmware with Microsoft's keys
// boots Debian's shim (signed by Microsoft) → Debian's network GRUB
// (signed by Debian) → Debian's signed kernel, with the configuration
// corrald renders for the MAC; the kernel runs locked down with the
// discovery command line. A kernel with one byte changed is refused by
// shim's verifier and nothing past it is fetched.
func TestSecureBootChain(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfSecbootCode, ovmfMSVars, "/usr/lib/shim/shimx64.efi.signed", "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed")
	if testKernel == "" {
		require.Missing(t, "no Debian kernel (run images/testkernel/fetch.sh): the Secure Boot chain needs a signed one")
	}
	t.Run("signed", func(t *testing.T) {
		l := newLab(t)
		c := l.corrald("--secure-boot", "--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150")
		mac := fmt.Sprintf("52:54:00:%s:%s:5b", l.id[:2], l.id[2:4])
		start := time.Now()
		v := secureBootVM(t, l, mac, "s"+l.id[:4])
		line := v.waitConsole(t, `CORRAL-TEST-INIT cmdline: [^\r\n]*\(err [^)]*\)`, vmTimeout)
		for _, re := range []string{`corral\.endpoint=\S+:20180`, `corral\.token=crl_[0-9a-f]{16}_[a-z2-7]{52}`,
			`corral\.ca=[0-9a-f]{64}`, `corral\.mac=` + regexp.QuoteMeta(mac)} {
			if !regexp.MustCompile(re).MatchString(line) {
				t.Errorf("kernel command line lacks %s: %s", re, line)
			}
		}
		if strings.Contains(line, "initrd=") {
			t.Errorf("GRUB's kernel command line carries iPXE's initrd= words: %s", line)
		}
		v.waitConsole(t, `CORRAL-TEST-INIT lockdown: [^\r\n]*\[integrity\]`, 30*time.Second)
		if !strings.Contains(v.console.String(), "Secure boot enabled") {
			t.Errorf("the kernel did not report Secure Boot on; console:\n%s", tail([]byte(v.console.String()), 4096))
		}
		es := c.waitTimeline(mac, append(secureBootChain,
			want{"tftp", "tftp-file", map[string]string{"file": `initrd\.img`, "bytes": `[1-9]\d+`}}), 30*time.Second)
		t.Logf("Secure Boot chain booted in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	})
	t.Run("tampered", func(t *testing.T) {
		b, err := os.ReadFile(testKernel)
		if err != nil {
			t.Fatal(err)
		}
		// One byte of the code changed: the signature no longer matches
		// the image's hash.
		b[len(b)/2] ^= 0xff
		bad := filepath.Join(t.TempDir(), "vmlinuz")
		if err := os.WriteFile(bad, b, 0o644); err != nil {
			t.Fatal(err)
		}
		l := newLab(t)
		c := l.corrald("--secure-boot", "--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--boot-kernel", bad)
		mac := fmt.Sprintf("52:54:00:%s:%s:5c", l.id[:2], l.id[2:4])
		start := time.Now()
		v := secureBootVM(t, l, mac, "x"+l.id[:4])
		v.waitConsole(t, `bad shim signature`, vmTimeout)
		c.waitTimeline(mac, secureBootChain, 30*time.Second)
		time.Sleep(3 * time.Second) // what GRUB would fetch next
		es := c.timeline(mac)
		for _, e := range es {
			if e.Source == "tftp" && e.Event == "tftp-file" && e.Attributes["file"] == "initrd.img" {
				t.Errorf("the initramfs was fetched after the kernel was refused:\n%s", render(es))
			}
		}
		if strings.Contains(v.console.String(), "Linux version") {
			t.Errorf("the tampered kernel ran; console:\n%s", tail([]byte(v.console.String()), 4096))
		}
		t.Logf("tampered kernel refused in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	})
}
