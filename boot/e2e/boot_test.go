package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// vmTimeout bounds one VM boot: ~15-30 s on a quiet machine under TCG, up
// to ~50 s on a busy one.
const vmTimeout = 4 * time.Minute

// guestReached waits for the guest console to prove the kernel ran with
// our command line (real test kernel), or at least that iPXE fetched the
// kernel and initrd (ipxe.lkrn stand-in).
func guestReached(t *testing.T, v *vm, mac string, uefi bool) {
	t.Helper()
	if testKernel == "" {
		require.Degraded(t, "no Linux test kernel (set CORRAL_TEST_KERNEL or run images/testkernel/fetch.sh): asserting up to the kernel download")
		if uefi {
			// EFI iPXE refuses ipxe.lkrn (no EFI stub) before the initrd.
			v.waitConsole(t, `vmlinuz\.\.\. ok`, vmTimeout)
			return
		}
		v.waitConsole(t, `initrd\.img\.\.\. ok`, vmTimeout)
		return
	}
	line := v.waitConsole(t, `CORRAL-TEST-INIT cmdline: [^\r\n]*\(err [^)]*\)`, vmTimeout)
	for _, re := range []string{`initrd=initrd\.img`, `corral\.endpoint=\S+:20180`, `corral\.token=crl_[0-9a-f]{16}_[a-z2-7]{52}`,
		`corral\.ca=[0-9a-f]{64}`, `corral\.mac=` + regexp.QuoteMeta(mac)} {
		if !regexp.MustCompile(re).MatchString(line) {
			t.Errorf("kernel command line lacks %s: %s", re, line)
		}
	}
	if n := len(strings.TrimPrefix(line, "CORRAL-TEST-INIT cmdline: ")) - len(" (err <nil>)"); n >= 2048 {
		t.Errorf("kernel command line is %d bytes", n)
	}
}

// httpChain is the HTTP part of a boot on the timeline.
func httpChain(uefi bool) []want {
	w := []want{
		{"http", "script", map[string]string{"intent": "discover", "kernel": "vmlinuz", "initrd": "initrd.img"}},
		{"http", "artifact", map[string]string{"file": "vmlinuz", "status": "200"}},
	}
	if testKernel == "" && uefi {
		return w // the stand-in kernel stops EFI iPXE before the initrd
	}
	return append(w, want{"http", "artifact", map[string]string{"file": "initrd.img", "status": "200"}})
}

// TestBIOSiPXE: SeaBIOS with QEMU's iPXE NIC ROM (virtio-net and e1000)
// → DHCP (full mode) → HTTP script → kernel and initramfs.
func TestBIOSiPXE(t *testing.T) {
	need(t, "qemu-system-x86_64")
	l := newLab(t)
	c := l.corrald("--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")
	for i, nic := range []string{"virtio-net-pci", "e1000"} {
		t.Run(nic, func(t *testing.T) {
			mac := fmt.Sprintf("52:54:00:%s:%s:%02x", l.id[:2], l.id[2:4], i+1)
			start := time.Now()
			v := l.vm(vmOpts{nic: nic, mac: mac, tap: l.tap(fmt.Sprintf("t%s%d", l.id[:4], i))})
			guestReached(t, v, mac, false)
			es := c.waitTimeline(mac, append([]want{
				{"dhcp", "discover", map[string]string{"arch": "0", "ipxe": "true", "new_machine": "true", "intent": "discover"}},
				{"dhcp", "offer", map[string]string{"boot": "script", "file": `http://.*/boot\.ipxe\?mac=` + regexp.QuoteMeta(mac), "echo_vendor_class": "PXEClient"}},
				{"dhcp", "ack", map[string]string{"ip": regexp.QuoteMeta(l.subnet) + `\.1[0-4]\d`}},
				// iPXE's ProxyDHCPREQUEST (it saw PXEClient echoed): answered,
				// it does not wait ~4 s for it.
				{"dhcp", "pxe-ack", map[string]string{"boot": "script"}},
			}, httpChain(false)...), 30*time.Second)
			t.Logf("%s: booted in %s; timeline:\n%s", nic, time.Since(start).Round(time.Second), render(es))
			v.stop(t)
			ra := false
			for _, e := range es {
				ra = ra || e.Source == "ra" && e.Event == "router-solicitation"
			}
			if !ra {
				t.Log("no router solicitation reached the RA responder (IPv6 may be off in this iPXE)")
			}
		})
	}
	out, err := c.cli("get", "machine")
	if err != nil || !strings.Contains(string(out), "DISCOVERED") {
		t.Errorf("corral get machine: %v\n%s", err, out)
	}
}

// uefiIPXE is the iPXE UEFI firmware PXE gets over TFTP: snponly.efi, or
// ipxe.efi where the catalog lacks it (boot/dhcp ChooseBoot).
const uefiIPXE = `(snponly|ipxe)\.efi`

// TestUEFIFirmwarePXE: q35 + OVMF with the NIC option ROM removed, so
// EDK2's own PXE client boots: DHCP → TFTP snponly.efi → iPXE → DHCP
// again → HTTP script → kernel and initramfs.
func TestUEFIFirmwarePXE(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfCode, ovmfVars)
	l := newLab(t)
	c := l.corrald("--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150")
	mac := fmt.Sprintf("52:54:00:%s:%s:e7", l.id[:2], l.id[2:4])
	start := time.Now()
	v := l.vm(vmOpts{uefi: true, nic: "virtio-net-pci", noROM: true, mac: mac, tap: l.tap("u" + l.id[:4])})
	guestReached(t, v, mac, true)
	es := c.waitTimeline(mac, append([]want{
		{"dhcp", "discover", map[string]string{"arch": "7", "ipxe": ""}},
		{"dhcp", "offer", map[string]string{"boot": "tftp", "file": uefiIPXE, "echo_vendor_class": ""}},
		{"dhcp", "ack", map[string]string{"file": uefiIPXE}},
		{"tftp", "tftp-file", map[string]string{"file": uefiIPXE, "bytes": `[1-9]\d+`}},
		{"dhcp", "discover", map[string]string{"arch": "7", "ipxe": "true"}},
		{"dhcp", "offer", map[string]string{"boot": "script"}},
	}, httpChain(true)...), 30*time.Second)
	t.Logf("UEFI booted in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
}

// TestProxyBesideDnsmasq: a real dnsmasq with no PXE options hands out the
// address; corrald in proxy mode supplies only the boot options (port 67
// offer and the port 4011 exchange).
func TestProxyBesideDnsmasq(t *testing.T) {
	need(t, "qemu-system-x86_64", "dnsmasq")
	l := newLab(t)
	dns, ifc := l.peer("d", l.subnet+".2/24")
	leases := filepath.Join(l.dir, "dnsmasq.leases")
	l.start("ip", "dnsmasq.log", "netns", "exec", dns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface="+ifc, "--bind-interfaces", "--dhcp-range="+l.subnet+".50,"+l.subnet+".99,255.255.255.0,1h",
		"--dhcp-leasefile="+leases, "--pid-file="+filepath.Join(l.dir, "dnsmasq.pid"), "--no-ping", "--log-dhcp", "--dhcp-authoritative")
	c := l.corrald("--dhcp-mode", "proxy")
	for i, tc := range []struct {
		name  string
		uefi  bool
		wants []want
	}{
		{"bios-ipxe", false, []want{
			{"dhcp", "discover", map[string]string{"ipxe": "true"}},
			{"dhcp", "offer", map[string]string{"proxy": "true", "boot": "script", "echo_vendor_class": "PXEClient"}},
		}},
		{"uefi-firmware", true, []want{
			{"dhcp", "discover", map[string]string{"arch": "7", "ipxe": ""}},
			{"dhcp", "offer", map[string]string{"proxy": "true", "boot": "tftp", "file": uefiIPXE, "echo_vendor_class": "PXEClient"}},
			{"tftp", "tftp-file", map[string]string{"file": uefiIPXE}},
			{"dhcp", "offer", map[string]string{"proxy": "true", "boot": "script"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.uefi {
				need(t, ovmfCode)
			}
			mac := fmt.Sprintf("52:54:00:%s:%s:d%d", l.id[:2], l.id[2:4], i)
			v := l.vm(vmOpts{uefi: tc.uefi, noROM: tc.uefi, nic: "virtio-net-pci", mac: mac, tap: l.tap(fmt.Sprintf("p%s%d", l.id[:4], i))})
			if !tc.uefi {
				got := v.waitConsole(t, `net0: `+regexp.QuoteMeta(l.subnet)+`\.\d+/`, vmTimeout)
				if !regexp.MustCompile(regexp.QuoteMeta(l.subnet) + `\.([5-9]\d)/`).MatchString(got) {
					t.Errorf("address %q is not from dnsmasq's range", got)
				}
			}
			guestReached(t, v, mac, tc.uefi)
			es := c.waitTimeline(mac, append(tc.wants, httpChain(tc.uefi)...), 30*time.Second)
			t.Logf("proxy timeline:\n%s", render(es))
			for _, e := range es {
				if e.Source == "dhcp" && (e.Event == "ack" || e.Attributes["ip"] != "" && e.Event == "offer") {
					t.Errorf("proxy mode handed out an address: %+v", e)
				}
			}
			v.stop(t)
			b, _ := os.ReadFile(leases)
			if !strings.Contains(string(b), mac) {
				t.Errorf("dnsmasq has no lease for %s:\n%s", mac, b)
			}
		})
	}
}

func hostIn(ip net.IP, lo, hi string) bool {
	a, b := net.ParseIP(lo).To4(), net.ParseIP(hi).To4()
	x := ip.To4()
	return x != nil && string(x) >= string(a) && string(x) <= string(b)
}
