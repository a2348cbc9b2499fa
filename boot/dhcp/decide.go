package dhcp

import (
	"bytes"
	"fmt"
	"net/url"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/corralhq/corral/images"
)

// optIPXEEncap is option 175, iPXE's encapsulated options: its presence
// means the client is iPXE.
var optIPXEEncap = dhcpv4.GenericOptionCode(175)

// Client is what a request says about the client that sent it.
type Client struct {
	MAC string
	// Arch is the first option 93 value; HasArch says whether it was sent.
	Arch    iana.Arch
	HasArch bool
	// VendorClass is option 60 as sent.
	VendorClass string
	// PXE: option 60 starts with "PXEClient"; HTTP: with "HTTPClient".
	PXE, HTTP bool
	// IPXE: user class (77) "iPXE" or option 175 present.
	IPXE bool
	// UUID is option 97 (client machine identifier), echoed to PXE clients.
	UUID []byte
}

// NetBoot reports whether the client asks to network-boot at all.
func (c Client) NetBoot() bool { return c.PXE || c.HTTP || c.IPXE || c.HasArch }

// Classify reads the client's identity and kind from a request. It never
// fails: missing or malformed options just leave fields empty.
func Classify(m *dhcpv4.DHCPv4) Client { return classify(m, m.ClientHWAddr.String()) }

// classify is Classify with the MAC already formatted.
func classify(m *dhcpv4.DHCPv4, mac string) Client {
	c := Client{MAC: mac}
	if archs := m.ClientArch(); len(archs) > 0 {
		c.Arch, c.HasArch = archs[0], true
	}
	c.VendorClass = m.ClassIdentifier()
	c.PXE = strings.HasPrefix(c.VendorClass, "PXEClient")
	c.HTTP = strings.HasPrefix(c.VendorClass, "HTTPClient")
	if raw := m.Options.Get(dhcpv4.OptionUserClassInformation); bytes.Contains(raw, []byte("iPXE")) {
		c.IPXE = true
	}
	if m.Options.Has(optIPXEEncap) {
		c.IPXE = true
	}
	if u := m.Options.Get(dhcpv4.OptionClientMachineIdentifier); len(u) > 0 && len(u) <= 17 {
		c.UUID = append([]byte(nil), u...)
	}
	return c
}

// netBoot is Classify(m).NetBoot() without building the Client: whether
// m carries option 93, 60 PXEClient/HTTPClient, 77 iPXE or 175.
func netBoot(m *dhcpv4.DHCPv4) bool {
	if len(m.ClientArch()) > 0 || m.Options.Has(optIPXEEncap) {
		return true
	}
	if vc := m.Options.Get(dhcpv4.OptionClassIdentifier); bytes.HasPrefix(vc, []byte("PXEClient")) || bytes.HasPrefix(vc, []byte("HTTPClient")) {
		return true
	}
	return bytes.Contains(m.Options.Get(dhcpv4.OptionUserClassInformation), []byte("iPXE"))
}

// BootKind says how the boot file is fetched.
type BootKind string

// The boot kinds ChooseBoot picks from.
const (
	BootNone   BootKind = "none"   // no boot options in the answer
	BootTFTP   BootKind = "tftp"   // File is a TFTP name, next-server is us
	BootScript BootKind = "script" // File is the iPXE script URL
	BootHTTP   BootKind = "http"   // File is an http:// URL (UEFI HTTP Boot)
)

// Boot is the boot part of an answer.
type Boot struct {
	Kind BootKind
	File string
	// Echo60 is the vendor class to send back ("" for none).
	Echo60 string
	// Reason explains the choice for the timeline.
	Reason string
	// RootPath is option 17 to send ("" for none): the http:// URL of
	// the per-machine GRUB config for GRUB's arm64 network loader, which
	// reads it from the firmware's DHCP answer (images.GRUBEmbeddedConfig
	// in images/discovery).
	RootPath string
}

// GRUBConfigPath is boot/http's path of the per-machine GRUB config.
const GRUBConfigPath = "/boot.grub"

// Env is what ChooseBoot needs to know about the appliance.
type Env struct {
	// ScriptURL is the iPXE script URL for a MAC.
	ScriptURL func(mac string) string
	// HTTPBase is http://host:port for artifact URLs.
	HTTPBase string
	// BootBase, when set, is the base of UEFI HTTP boot clients' URL
	// instead of HTTPBase (an https:// front).
	BootBase string
	// Has reports whether the catalog holds a name.
	Has func(name string) bool
	// Proxy is true in proxy mode: firmware PXE clients then get option 60
	// PXEClient (with option 43, added by the reply builder) so they
	// accept an answer without an address.
	Proxy bool
	// SecureBoot: x64 UEFI firmware PXE clients get the signed chain
	// (shimx64.efi, which loads grubx64.efi) instead of iPXE, and UEFI
	// HTTP boot clients of x64 get no boot file (docs/architecture.md,
	// "Secure Boot").
	SecureBoot bool
}

// Architecture numbers (option 93, RFC 4578 and IANA's registry).
const (
	archBIOS      iana.Arch = 0
	archEFIx64    iana.Arch = 7
	archEFIBC     iana.Arch = 9
	archEFIarm64  iana.Arch = 11
	archHTTPx64   iana.Arch = 16
	archHTTParm64 iana.Arch = 19
)

// ChooseBoot decides what a client boots (boot/README.md):
//   - iPXE (user class 77 "iPXE" or option 175) gets the HTTP script URL,
//     which breaks the DHCP→iPXE→DHCP loop; option 60 PXEClient is echoed
//     when it sent it, so iPXE does not wait for proxy offers;
//   - UEFI HTTP Boot (option 60 HTTPClient, arch 16/19) gets a full http://
//     URL of the iPXE binary (arch 19: of the arm64 loader) and option 60 HTTPClient echoed (exactly that,
//     never the client's string), no next-server; an HTTPClient with
//     another architecture or none gets no boot options;
//   - firmware PXE gets the TFTP iPXE binary for its arch (0 BIOS →
//     undionly.kpxe, 7/9 → snponly.efi, else ipxe.efi; 11 → GRUB's arm64
//     network loader, or snp-arm64.efi when shipped; 7/9 with
//     Env.SecureBoot → shimx64.efi) and
//     no option 60 (in full mode; EDK2 would then look for a boot server);
//   - anything else gets no boot options.
//
// An arm64 client booting GRUB's loader also gets option 17 (RootPath).
// It is a pure function of its inputs.
func ChooseBoot(c Client, env Env) Boot {
	switch {
	case c.IPXE:
		b := Boot{Kind: BootScript, File: env.ScriptURL(c.MAC), Reason: "iPXE client: HTTP script"}
		if c.PXE {
			b.Echo60 = "PXEClient"
		}
		return b
	case c.HTTP || (c.HasArch && (c.Arch == archHTTPx64 || c.Arch == archHTTParm64)):
		var name string
		switch {
		case c.HasArch && c.Arch == archHTTPx64 && env.SecureBoot:
			// Debian's signed network GRUB fetches over TFTP only: shim
			// over HTTP would load a GRUB that cannot read its config.
			return Boot{Kind: BootNone, Reason: "UEFI HTTP client (arch 16): the Secure Boot chain is served over TFTP only (signed GRUB has no HTTP): boot the machine by PXE"}
		case c.HasArch && c.Arch == archHTTPx64:
			name = images.IPXEEFI
		case c.HasArch && c.Arch == archHTTParm64:
			name = arm64Loader(env)
		case !c.HasArch:
			// UEFI 2.10 §24.7.2: an HTTP boot client sends option 93.
			return Boot{Kind: BootNone, Reason: "UEFI HTTP client without option 93 (architecture): refused"}
		default:
			// An HTTPClient claiming a PXE or BIOS architecture is no
			// HTTP boot client we know a binary for: an x64 EFI URL
			// would be the wrong answer.
			return Boot{Kind: BootNone, Reason: fmt.Sprintf("UEFI HTTP client with arch %d (%s): only 16 (x64 UEFI HTTP) and 19 (arm64 UEFI HTTP) are served", uint16(c.Arch), c.Arch.String())}
		}
		if name == "" {
			return Boot{Kind: BootNone, Reason: fmt.Sprintf("UEFI HTTP client (arch %d): %s", uint16(c.Arch), noARM64Loader)}
		}
		if !env.Has(name) {
			return Boot{Kind: BootNone, Reason: fmt.Sprintf("UEFI HTTP client (arch %d): no %s in the catalog", uint16(c.Arch), name)}
		}
		// The MAC in the query puts the firmware's download on the
		// machine's timeline (boot/http reads it as it does iPXE's); the
		// firmware picks the image type from the path (".efi").
		base := env.HTTPBase
		if env.BootBase != "" {
			base = env.BootBase
		}
		return Boot{Kind: BootHTTP, File: base + "/images/" + name + "?mac=" + c.MAC, Echo60: "HTTPClient", Reason: "UEFI HTTP Boot client",
			RootPath: grubRootPath(env, name, c.MAC)}
	case c.PXE || c.HasArch:
		if !c.HasArch {
			// PXE 2.1 makes option 93 mandatory; treat its absence as BIOS.
			c.Arch = archBIOS
		}
		var names []string
		switch c.Arch {
		case archBIOS:
			names = []string{images.UndionlyKPXE, images.IPXEPXE}
		case archEFIx64, archEFIBC:
			if env.SecureBoot {
				// shim (signed by Microsoft) loads grubx64.efi (signed
				// by Debian) from the same server; iPXE is signed by
				// no one the firmware trusts.
				if !env.Has(images.GrubX64EFI) {
					return Boot{Kind: BootNone, Reason: fmt.Sprintf("firmware PXE, arch %d, Secure Boot: no %s in the catalog", uint16(c.Arch), images.GrubX64EFI)}
				}
				names = []string{images.ShimX64EFI}
				break
			}
			// snponly.efi first: it drives the NIC the firmware booted
			// from through the firmware's SNP and starts at once, where
			// ipxe.efi (every native driver) spent ~5 s starting and is
			// 5x larger over TFTP (bench/README.md, "Virtual rack").
			names = []string{images.SNPOnlyEFI, images.IPXEEFI}
		case archEFIarm64:
			if names = []string{arm64Loader(env)}; names[0] == "" {
				return Boot{Kind: BootNone, Reason: fmt.Sprintf("PXE client arch %d (%s): %s", uint16(c.Arch), c.Arch.String(), noARM64Loader)}
			}
		default:
			return Boot{Kind: BootNone, Reason: fmt.Sprintf("PXE client arch %d (%s) is not supported", uint16(c.Arch), c.Arch.String())}
		}
		for _, n := range names {
			if env.Has(n) {
				b := Boot{Kind: BootTFTP, File: n, Reason: fmt.Sprintf("firmware PXE, arch %d (%s)", uint16(c.Arch), c.Arch.String()),
					RootPath: grubRootPath(env, n, c.MAC)}
				if env.Proxy {
					b.Echo60 = "PXEClient"
				}
				return b
			}
		}
		return Boot{Kind: BootNone, Reason: fmt.Sprintf("PXE client arch %d: no iPXE binary for it in the catalog", uint16(c.Arch))}
	}
	return Boot{Kind: BootNone, Reason: "not a network-boot client"}
}

// noARM64Loader is the reason an arm64 client gets no boot file.
const noARM64Loader = "no arm64 boot loader in the catalog (" + images.GRUBARM64EFI + " or " + images.SNPArm64EFI + "): run corrald images build --arch arm64"

// arm64Loader is the catalog's arm64 first stage: GRUB's network loader,
// else an arm64 iPXE when one was shipped, else "".
func arm64Loader(env Env) string {
	for _, n := range []string{images.GRUBARM64EFI, images.SNPArm64EFI} {
		if env.Has(n) {
			return n
		}
	}
	return ""
}

// grubRootPath is option 17 for a client booting loader: the per-machine
// GRUB config's plain-http URL when loader is GRUB's (its http module
// has no TLS), else "".
func grubRootPath(env Env, loader, mac string) string {
	if loader != images.GRUBARM64EFI {
		return ""
	}
	return env.HTTPBase + GRUBConfigPath + "?mac=" + mac
}

// longestBootPath is the longest path and query an HTTP boot URL carries
// after its base.
const longestBootPath = "/images/" + images.GRUBARM64EFI + "?mac=00:00:00:00:00:00"

// checkBootBase checks an HTTP boot base URL (Config.HTTPBootBase) and
// returns it without a trailing slash: http or https, a host, no path,
// query, fragment or user, and short enough that the longest boot URL
// fits the 128-byte file field with its terminating zero.
func checkBootBase(raw string) (string, error) {
	b := strings.TrimSuffix(raw, "/")
	u, err := url.Parse(b)
	switch {
	case err != nil:
		return "", fmt.Errorf("dhcp: HTTP boot base %q: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("dhcp: HTTP boot base %q: want http:// or https://", raw)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("dhcp: HTTP boot base %q has no host", raw)
	case u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "":
		return "", fmt.Errorf("dhcp: HTTP boot base %q: give scheme, host and port only", raw)
	case len(b)+len(longestBootPath) > 127:
		return "", fmt.Errorf("dhcp: HTTP boot base %q is too long: the boot URL must fit the 128-byte file field (base at most %d bytes)", raw, 127-len(longestBootPath))
	}
	return b, nil
}
