package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// newLab6 is a lab whose bridge has only an IPv6 address (fd77:N::1/64):
// an IPv6-only boot segment.
func newLab6(t *testing.T) (*lab, string) {
	t.Helper()
	l := newLab(t)
	l.ipn(l.ns, "-4", "addr", "flush", "dev", l.bridge) // keep the link-local address
	prefix := "fd77:" + l.subnet[strings.LastIndex(l.subnet, ".")+1:] + "::"
	l.ipn(l.ns, "addr", "add", prefix+"1/64", "dev", l.bridge, "nodad")
	return l, prefix
}

// TestUEFIFirmwarePXEv6: OVMF (IPv4 PXE switched off through fw_cfg) on an
// IPv6-only segment: RA with the managed flag → DHCPv6 SOLICIT/REQUEST
// against corrald's boot/dhcp6 → option 59 tftp://[addr]/snponly.efi →
// the iPXE binary over TFTP on IPv6 → iPXE's own DHCPv6 (user class
// iPXE) → the script, kernel and initramfs over HTTP to [addr]:8080, the
// script held to the address leased to the MAC.
func TestUEFIFirmwarePXEv6(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfCode, "/usr/share/OVMF/OVMF_VARS_4M.fd")
	l, prefix := newLab6(t)
	c := l.corrald("--dhcp-mode", "off", "--dhcp6-range", prefix+"100-"+prefix+"1ff", "--ra-router-lifetime", "30m")
	mac := fmt.Sprintf("52:54:00:%s:%s:e6", l.id[:2], l.id[2:4])
	start := time.Now()
	v := l.vm(vmOpts{uefi: true, nic: "virtio-net-pci", noROM: true, mac: mac, tap: l.tap("s" + l.id[:4]),
		extra: []string{"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n"}})
	es := c.waitTimeline(mac, []want{
		{"dhcp6", "solicit", map[string]string{"arch": "7", "reply": "advertise"}},
		{"dhcp6", "request", map[string]string{"reply": "reply", "file": `tftp://\[` + prefix + `1\]/` + uefiIPXE}},
		{"tftp", "tftp-file", map[string]string{"file": uefiIPXE, "bytes": `[1-9]\d+`}},
	}, 90*time.Second)
	t.Logf("OVMF PXEv6 fetched iPXE in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	// iPXE's own DHCPv6 (user class iPXE) → the script over IPv6.
	guestReached(t, v, mac, true)
	es = c.waitTimeline(mac, append([]want{
		{"dhcp6", "solicit", map[string]string{"ipxe": "true", "file": `http://\[` + prefix + `1\]:8080/boot\.ipxe\?mac=` + mac}},
		{"dhcp6", "request", map[string]string{"ipxe": "true", "reply": "reply"}},
	}, httpChain(true)...), 30*time.Second)
	for _, e := range es {
		if e.Source == "http" && !strings.HasPrefix(e.Attributes["peer"], prefix) {
			t.Errorf("HTTP over IPv4 or from outside the range: %+v", e)
		}
	}
	t.Logf("iPXE over IPv6 in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	v.stop(t)
	if out, err := exec.Command("ip", "-n", l.ns, "-6", "neigh").CombinedOutput(); err == nil {
		t.Logf("neighbours:\n%s", out)
	}
}

// TestUEFIFirmwareHTTPv6: OVMF with both PXE stacks switched off through
// fw_cfg boots its HTTP entries; on an IPv6-only segment HTTPv6 asks
// DHCPv6 with vendor class HTTPClient and gets
// http://[addr]:8080/images/ipxe.efi, with no TFTP listener at all; iPXE
// then boots the discovery image over IPv6 as under PXEv6. About 2m20s
// under TCG, over the 2-minute aim: the firmware's first attempt, the
// HTTPv6 entry this test writes, fails at once without a packet, then
// OVMF's own HTTPv4 entry waits out its DHCPv4 (~60 s) before its own
// HTTPv6 entry boots (docs/architecture.md, "UEFI HTTP boot").
func TestUEFIFirmwareHTTPv6(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfCode, "/usr/share/OVMF/OVMF_VARS_4M.fd")
	l, prefix := newLab6(t)
	c := l.corrald("--dhcp-mode", "off", "--dhcp6-range", prefix+"100-"+prefix+"1ff", "--tftp-listen", "off")
	mac := fmt.Sprintf("52:54:00:%s:%s:e8", l.id[:2], l.id[2:4])
	start := time.Now()
	// HTTPv6 is made the next boot (Boot0080 + BootNext), else OVMF tries
	// HTTPv4 on this IPv6-only segment first and waits out its timeout.
	v := l.httpBootVM(t, mac, l.tap("h"+l.id[:4]), true,
		"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n", "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
	// The firmware's fetch of ipxe.efi carries no MAC (the URL has no
	// ?mac=), so the timeline shows iPXE's own DHCPv6 after it instead.
	guestReached(t, v, mac, true)
	es := c.waitTimeline(mac, append([]want{
		{"dhcp6", "request", map[string]string{"arch": "16", "file": `http://\[` + prefix + `1\]:8080/images/ipxe\.efi`}},
		{"dhcp6", "request", map[string]string{"ipxe": "true", "file": `http://\[` + prefix + `1\]:8080/boot\.ipxe\?mac=` + mac}},
	}, httpChain(true)...), 30*time.Second)
	t.Logf("OVMF HTTPv6 boot in %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	// The firmware's first attempt is HTTPv6 (BootNext), not HTTPv4.
	if starts := regexp.MustCompile(`Start (PXE|HTTP) Boot over IPv[46]`).FindAllString(v.console.String(), -1); len(starts) == 0 || starts[0] != "Start HTTP Boot over IPv6" {
		t.Errorf("the firmware's boot attempts: %q, want HTTP over IPv6 first", starts)
	}
	v.stop(t)
}
