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

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// httpBootSlot is the PCI slot the HTTP boot tests put the NIC in: the
// Boot#### entry names it (q35 has the host bridge in 0 and VGA in 1).
const httpBootSlot = 3

// httpBootVM starts an OVMF guest whose firmware boots its NIC by UEFI
// HTTP boot (IPv4, or IPv6 when v6) first: Boot0080 + BootNext in its
// variable store; extra are more QEMU arguments.
func (l *lab) httpBootVM(t *testing.T, mac, tap string, v6 bool, extra ...string) *vm {
	t.Helper()
	base, err := os.ReadFile(ovmfVars)
	if err != nil {
		t.Fatal(err)
	}
	hw, _ := net.ParseMAC(mac)
	vars, err := httpBootVars(base, hw, httpBootSlot, v6)
	if err != nil {
		t.Fatalf("%s: %v", ovmfVars, err)
	}
	path := filepath.Join(l.dir, "OVMF_VARS-http-"+strings.ReplaceAll(mac, ":", "")+".fd")
	if err := os.WriteFile(path, vars, 0o644); err != nil {
		t.Fatal(err)
	}
	return l.vm(vmOpts{uefi: true, nic: "virtio-net-pci", noROM: true, mac: mac, tap: tap, vars: path, slot: httpBootSlot, extra: extra})
}

// TestUEFIHTTPBoot: OVMF's own UEFI HTTP boot client (option 60
// "HTTPClient", arch 16) against corrald with no TFTP listener at all:
// DHCP → the iPXE binary by HTTP from the URL in the answer → iPXE →
// DHCP again → HTTP script → kernel and initramfs. The answers are read
// off the wire as well as from the timeline, and no TFTP packet may cross
// the segment.
func TestUEFIHTTPBoot(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfCode, ovmfVars)
	l := newLab(t)
	sn := l.sniff(t)
	c := l.corrald("--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--tftp-listen", "off")
	mac := fmt.Sprintf("52:54:00:%s:%s:a4", l.id[:2], l.id[2:4])
	start := time.Now()
	v := l.httpBootVM(t, mac, l.tap("h"+l.id[:4]), false)
	v.waitConsole(t, `Start HTTP Boot over IPv4`, vmTimeout)
	url := `http://` + regexp.QuoteMeta(l.subnet) + `\.1:8080/images/ipxe\.efi\?mac=` + regexp.QuoteMeta(mac)
	guestReached(t, v, mac, true)
	es := c.waitTimeline(mac, append([]want{
		{"dhcp", "discover", map[string]string{"arch": "16", "ipxe": "", "vendor_class": `HTTPClient:Arch:00016:.*`}},
		{"dhcp", "offer", map[string]string{"boot": "http", "file": url, "echo_vendor_class": "HTTPClient"}},
		{"dhcp", "ack", map[string]string{"boot": "http", "file": url}},
		{"http", "artifact", map[string]string{"file": "ipxe.efi", "status": "200"}},
		{"dhcp", "discover", map[string]string{"ipxe": "true"}},
		{"dhcp", "offer", map[string]string{"boot": "script"}},
	}, httpChain(true)...), 30*time.Second)
	script := sn.waitScript(t, 10*time.Second)
	t.Logf("UEFI HTTP boot: power-on → first script GET %s, → kernel %s; timeline:\n%s",
		script.Sub(start).Round(100*time.Millisecond), time.Since(start).Round(time.Second), render(es))
	v.stop(t)

	replies, tftp, _ := sn.seen()
	if tftp != 0 {
		t.Errorf("%d TFTP packets crossed the segment", tftp)
	}
	// UEFI 2.10 §24.7.2 (DHCP options for HTTP boot): the answer to an
	// HTTPClient echoes option 60 "HTTPClient" and gives the boot URI in
	// the file field; nothing points at a TFTP server (siaddr 0, no
	// option 66), and iPXE's PXE options (43) are absent.
	kinds := map[dhcpv4.MessageType]int{}
	for _, m := range replies {
		if m.ClassIdentifier() != "HTTPClient" {
			continue
		}
		kinds[m.MessageType()]++
		if !regexp.MustCompile(`^` + url + `$`).MatchString(m.BootFileName) {
			t.Errorf("%s: file %q is not the iPXE URL", m.MessageType(), m.BootFileName)
		}
		if !m.ServerIPAddr.IsUnspecified() {
			t.Errorf("%s: siaddr %s (a next server for TFTP)", m.MessageType(), m.ServerIPAddr)
		}
		for _, o := range []dhcpv4.OptionCode{dhcpv4.OptionTFTPServerName, dhcpv4.OptionVendorSpecificInformation} {
			if m.Options.Has(o) {
				t.Errorf("%s carries option %s", m.MessageType(), o)
			}
		}
		if m.YourIPAddr.IsUnspecified() || m.SubnetMask() == nil {
			t.Errorf("%s: no address or netmask: %s", m.MessageType(), m.Summary())
		}
	}
	if kinds[dhcpv4.MessageTypeOffer] == 0 || kinds[dhcpv4.MessageTypeAck] == 0 {
		t.Errorf("on the wire: HTTPClient answers %v, want an OFFER and an ACK (of %d answers seen)", kinds, len(replies))
	}
}
