package dhcp6

import (
	"bytes"
	"fmt"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/corralhq/corral/images"
)

// Client is what a request says about the client's boot.
type Client struct {
	MAC string
	// Arch is the first option 61 value; HasArch says it was sent.
	Arch    iana.Arch
	HasArch bool
	// PXE, HTTP: option 16's class data starts with PXEClient / HTTPClient.
	PXE, HTTP bool
	// IPXE: user class (15) "iPXE".
	IPXE bool
}

// Classify reads the client's kind from a message; malformed or missing
// options leave fields empty.
func Classify(m *dhcpv6.Message, mac string) Client {
	c := Client{MAC: mac}
	if archs := m.Options.ArchTypes(); len(archs) > 0 {
		c.Arch, c.HasArch = archs[0], true
	}
	for _, vc := range m.Options.VendorClasses() {
		for _, d := range vc.Data {
			c.PXE = c.PXE || bytes.HasPrefix(d, []byte("PXEClient"))
			c.HTTP = c.HTTP || bytes.HasPrefix(d, []byte("HTTPClient"))
		}
	}
	for _, uc := range m.Options.UserClasses() {
		if bytes.Equal(uc, []byte("iPXE")) {
			c.IPXE = true
		}
	}
	return c
}

// NetBoot reports whether the client asks to network-boot.
func (c Client) NetBoot() bool { return c.PXE || c.HTTP || c.IPXE || c.HasArch }

// Boot is the boot part of an answer: option 59's URL ("" for none),
// whether to echo option 16 HTTPClient, and why.
type Boot struct {
	URL        string
	HTTPClient bool
	Reason     string
}

// Env is what ChooseBoot needs to know about the appliance.
type Env struct {
	// HTTPBase is http://[addr]:port; TFTPHost is [addr].
	HTTPBase, TFTPHost string
	Has                func(name string) bool
}

// Architecture numbers (option 61, RFC 5970 and IANA's registry).
const (
	archEFIx64    iana.Arch = 7
	archEFIBC     iana.Arch = 9
	archEFIarm64  iana.Arch = 11
	archHTTPx64   iana.Arch = 16
	archHTTParm64 iana.Arch = 19
)

// ChooseBoot decides a client's boot file URL (boot/README.md, IPv6):
//   - iPXE (user class "iPXE") gets the HTTP script URL for its MAC;
//   - UEFI HTTP Boot (vendor class HTTPClient, arch 16/19) gets
//     http://[addr]:port/images/ipxe.efi (snp-arm64.efi for 19) and the
//     vendor class echoed;
//   - firmware PXEv6 (arch 7/9, 11) gets tftp://[addr]/snponly.efi (else
//     ipxe.efi; snp-arm64.efi for 11);
//   - anything else, and a client whose MAC is unknown, gets none.
//
// It is a pure function of its inputs.
func ChooseBoot(c Client, env Env) Boot {
	if !c.NetBoot() {
		return Boot{Reason: "not a network-boot client"}
	}
	if c.MAC == "" {
		return Boot{Reason: "network-boot client without a link-layer address: no boot file"}
	}
	switch {
	case c.IPXE:
		return Boot{URL: env.HTTPBase + "/boot.ipxe?mac=" + c.MAC, Reason: "iPXE client: HTTP script over IPv6"}
	case c.HTTP || (c.HasArch && (c.Arch == archHTTPx64 || c.Arch == archHTTParm64)):
		name := images.IPXEEFI
		if c.HasArch && c.Arch == archHTTParm64 {
			name = images.SNPArm64EFI
		}
		if !env.Has(name) {
			return Boot{Reason: fmt.Sprintf("UEFI HTTP client (arch %d): no %s in the catalog", uint16(c.Arch), name)}
		}
		return Boot{URL: env.HTTPBase + "/images/" + name, HTTPClient: true, Reason: "UEFI HTTPv6 Boot client"}
	}
	var names []string
	switch {
	case !c.HasArch:
		return Boot{Reason: "PXEv6 client without an architecture (option 61)"}
	case c.Arch == archEFIx64 || c.Arch == archEFIBC:
		names = []string{images.SNPOnlyEFI, images.IPXEEFI}
	case c.Arch == archEFIarm64:
		names = []string{images.SNPArm64EFI}
	default:
		return Boot{Reason: fmt.Sprintf("PXEv6 client arch %d (%s) is not supported", uint16(c.Arch), c.Arch.String())}
	}
	for _, n := range names {
		if env.Has(n) {
			return Boot{URL: "tftp://" + env.TFTPHost + "/" + n, Reason: fmt.Sprintf("firmware PXEv6, arch %d (%s)", uint16(c.Arch), c.Arch.String())}
		}
	}
	return Boot{Reason: fmt.Sprintf("PXEv6 client arch %d: no iPXE binary for it in the catalog", uint16(c.Arch))}
}
