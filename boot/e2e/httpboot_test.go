package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ovmfvars"
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
	vars, err := ovmfvars.HTTPBootVars(base, hw, httpBootSlot, v6)
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

// TestUEFIHTTPSBoot: the same firmware over HTTPS with the appliance's
// own boot CA (--https-boot-listen): the CA is printed by the built
// binary's `corrald boot-ca --format esl` and given to OVMF as
// etc/edk2/https/cacerts (what an operator enrols in a machine's firmware
// setup); DHCP answers an https:// URL on the TLS listener, the firmware
// verifies the RSA chain, fetches iPXE over TLS and the chain goes on over
// plain HTTP as before. No TFTP listener. A second machine whose firmware
// trusts another CA (another data directory's boot CA) is refused by its
// own firmware: the handshake fails and no byte of iPXE is served to it.
func TestUEFIHTTPSBoot(t *testing.T) {
	need(t, "qemu-system-x86_64", ovmfCode, ovmfVars)
	l := newLab(t)
	c := l.corrald("--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--tftp-listen", "off", "--https-boot-listen", ":8443")
	esl, err := exec.Command(filepath.Join(binDir, "corrald"), "boot-ca", "--format", "esl", "--data-dir", c.dataDir).Output()
	if err != nil {
		t.Fatalf("corrald boot-ca: %v", err)
	}
	cacerts := filepath.Join(l.dir, "boot-ca.esl")
	if err := os.WriteFile(cacerts, esl, 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := exec.Command(filepath.Join(binDir, "corrald"), "boot-ca", "--format", "esl", "--data-dir", filepath.Join(l.dir, "other")).Output()
	if err != nil {
		t.Fatalf("corrald boot-ca (another data directory): %v", err)
	}
	otherCerts := filepath.Join(l.dir, "other-ca.esl")
	if err := os.WriteFile(otherCerts, other, 0o644); err != nil {
		t.Fatal(err)
	}
	// A standard client that trusts the boot CA: the certificate names
	// the boot address, the listener serves artifacts and nothing else
	// (the script and its per-boot token stay on plain HTTP).
	pemCA, err := exec.Command(filepath.Join(binDir, "corrald"), "boot-ca", "--data-dir", c.dataDir).Output()
	if err != nil {
		t.Fatalf("corrald boot-ca: %v", err)
	}
	caFile := filepath.Join(l.dir, "boot-ca.pem")
	if err := os.WriteFile(caFile, pemCA, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, code := range map[string]string{"/images/ipxe.efi": "200", "/boot.ipxe?mac=52:54:00:00:00:01": "404", "/os-images/x": "404"} {
		out, err := nsExec(l.ns, "curl", "-sS", "--cacert", caFile, "-o", "/dev/null", "-w", "%{http_code}", "https://"+l.subnet+".1:8443"+path)
		if err != nil || string(out) != code {
			t.Errorf("curl https %s: %q (%v), want %s", path, out, err, code)
		}
	}
	mac := fmt.Sprintf("52:54:00:%s:%s:a5", l.id[:2], l.id[2:4])
	wrongMAC := fmt.Sprintf("52:54:00:%s:%s:a6", l.id[:2], l.id[2:4])
	start := time.Now()
	v := l.httpBootVM(t, mac, l.tap("s"+l.id[:4]), false, "-fw_cfg", "name=etc/edk2/https/cacerts,file="+cacerts)
	wrong := l.httpBootVM(t, wrongMAC, l.tap("w"+l.id[:4]), false, "-fw_cfg", "name=etc/edk2/https/cacerts,file="+otherCerts)
	v.waitConsole(t, `Start HTTP Boot over IPv4`, vmTimeout)
	url := `https://` + regexp.QuoteMeta(l.subnet) + `\.1:8443/images/ipxe\.efi\?mac=` + regexp.QuoteMeta(mac)
	guestReached(t, v, mac, true)
	es := c.waitTimeline(mac, append([]want{
		{"dhcp", "offer", map[string]string{"boot": "http", "file": url, "echo_vendor_class": "HTTPClient"}},
		{"http", "artifact", map[string]string{"file": "ipxe.efi", "status": "200", "tls": `TLS 1\.2 TLS_RSA_WITH_.*`}},
		{"dhcp", "discover", map[string]string{"ipxe": "true"}},
	}, httpChain(true)...), 30*time.Second)
	t.Logf("UEFI HTTPS boot: power-on → kernel %s; timeline:\n%s", time.Since(start).Round(time.Second), render(es))
	v.stop(t)

	wrong.waitConsole(t, `Could not retrieve NBP file size`, vmTimeout)
	wrong.stop(t)
	for _, e := range c.timeline(wrongMAC) {
		if e.Source == "http" && e.Event == "artifact" {
			t.Errorf("a firmware that does not trust the boot CA was served %s", e.Attributes["file"])
		}
	}
}
