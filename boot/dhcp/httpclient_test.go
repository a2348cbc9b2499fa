package dhcp

import (
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// TestHTTPClientHostileOptions: options 60 and 93 of a UEFI HTTP boot
// request as anyone on the boot LAN can send them. A well-formed request
// (arch 16 first, whatever follows) gets the normal answer, with option
// 60 exactly "HTTPClient" (never the client's string echoed) and no next
// server; an HTTPClient with another architecture, or none, or an option
// 93 that does not decode, gets an address but no boot options, and the
// timeline says why. The vendor class reaches the timeline escaped and
// bounded, however many option-60 pieces carried it.
func TestHTTPClientHostileOptions(t *testing.T) {
	f := newFixture(t, ModeFull)
	long := "HTTPClient:Arch:00016:UNDI:003001" + strings.Repeat("\x1b]0;x\x07\u202e", 120)
	archList := []byte{0, 16}
	for i := 0; i < 120; i++ {
		archList = append(archList, 0xff, byte(i))
	}
	for i, tc := range []struct {
		name   string
		opts   []dhcpv4.Option
		refuse string // "" = the normal answer
	}{
		{"oversized vendor class", []dhcpv4.Option{dhcpv4.OptClassIdentifier(long), dhcpv4.OptClientArch(iana.Arch(16))}, ""},
		{"121 architectures", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient"), dhcpv4.OptGeneric(dhcpv4.OptionClientSystemArchitectureType, archList)}, ""},
		{"arch 0 (BIOS)", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient"), dhcpv4.OptClientArch(iana.INTEL_X86PC)}, "arch 0 "},
		{"arch 7 (EFI PXE)", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient:Arch:00007"), dhcpv4.OptClientArch(iana.EFI_X86_64)}, "arch 7 "},
		{"arch 65535", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient"), dhcpv4.OptClientArch(iana.Arch(0xffff))}, "arch 65535 "},
		{"no option 93", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient")}, "without option 93"},
		{"odd-length option 93", []dhcpv4.Option{dhcpv4.OptClassIdentifier("HTTPClient"), dhcpv4.OptGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 16, 0})}, "without option 93"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hw := mac(0x4800 + i)
			d := discover(t, hw, plain)
			for _, o := range tc.opts {
				d.UpdateOption(o)
			}
			offer, _ := f.do(t, d)
			if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.IsUnspecified() {
				t.Fatalf("no OFFER with an address: %v", offer)
			}
			if n := len(offer.ToBytes()); n > 576 {
				t.Errorf("OFFER is %d bytes (RFC 2131's 576 any client takes)", n)
			}
			if !offer.ServerIPAddr.IsUnspecified() || offer.Options.Has(dhcpv4.OptionTFTPServerName) {
				t.Errorf("OFFER names a next server: siaddr %s, option 66 %q", offer.ServerIPAddr, offer.Options.Get(dhcpv4.OptionTFTPServerName))
			}
			tl := f.timeline(t, hw)
			if strings.ContainsAny(tl, "\x1b\x07\u202e") {
				t.Errorf("timeline holds raw control characters:\n%q", tl)
			}
			for _, line := range strings.Split(tl, "\n") {
				if len(line) > 1000 { // the vendor class shown at most 255 bytes, twice
					t.Errorf("timeline entry of %d bytes", len(line))
				}
			}
			if url := "http://10.0.0.1:8080/images/ipxe.efi?mac=" + hw.String(); tc.refuse == "" {
				if offer.BootFileName != url || offer.ClassIdentifier() != "HTTPClient" {
					t.Errorf("OFFER file %q, option 60 %q; want %q, HTTPClient", offer.BootFileName, offer.ClassIdentifier(), url)
				}
				return
			}
			if offer.BootFileName != "" || offer.Options.Has(dhcpv4.OptionClassIdentifier) {
				t.Errorf("refused client got boot options: file %q, option 60 %q", offer.BootFileName, offer.ClassIdentifier())
			}
			if !strings.Contains(tl, "boot none") || !strings.Contains(tl, tc.refuse) {
				t.Errorf("timeline does not say why (%q):\n%s", tc.refuse, tl)
			}
		})
	}
}

// TestHTTPBootBase: with Config.HTTPBootBase (corrald serve
// --http-boot-base) a UEFI HTTP boot client gets its URL there, https://
// included, and everything else stays on the appliance's HTTP; a base
// that is no scheme+host, or too long for the 128-byte file field once
// the longest boot path is added, is refused when the server is made.
func TestHTTPBootBase(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) { c.HTTPBootBase = "https://boot.example.net:8443/" })
	hw := mac(0x4900)
	offer, ack := f.dora(t, hw, httpClient)
	for _, m := range []*dhcpv4.DHCPv4{offer, ack} {
		if want := "https://boot.example.net:8443/images/ipxe.efi?mac=" + hw.String(); m.BootFileName != want || m.ClassIdentifier() != "HTTPClient" {
			t.Errorf("%s: file %q, option 60 %q; want %q, HTTPClient", m.MessageType(), m.BootFileName, m.ClassIdentifier(), want)
		}
	}
	if offer, _ := f.dora(t, mac(0x4901), ipxeClient); !strings.HasPrefix(offer.BootFileName, "http://10.0.0.1:8080/boot.ipxe?") {
		t.Errorf("iPXE's script URL moved to the boot base: %q", offer.BootFileName)
	}
	for _, bad := range []string{"ftp://x", "https://", "https://x/path", "https://x?q=1", "https://u:p@x", "x:8443",
		"https://" + strings.Repeat("a", 127-len(longestBootPath)-len("https://")+1)} {
		if _, err := checkBootBase(bad); err == nil {
			t.Errorf("base %q accepted", bad)
		}
	}
	ok := "https://" + strings.Repeat("a", 127-len(longestBootPath)-len("https://"))
	if b, err := checkBootBase(ok + "/"); err != nil || len(b+longestBootPath) != 127 {
		t.Errorf("base of the longest length: %q, %v", b, err)
	}
}
