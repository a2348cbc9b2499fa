package dhcp

import (
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/corralhq/corral/images"
)

// AAVMF's firmware PXE and UEFI HTTP boot, as they ask.
func arm64PXE(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00011:UNDI:003000"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.Arch(11)))
}

func arm64HTTP(d *dhcpv4.DHCPv4) {
	d.UpdateOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00019:UNDI:003000"))
	d.UpdateOption(dhcpv4.OptClientArch(iana.Arch(19)))
}

// TestChooseBootARM64: arch 11 and 19 get GRUB's arm64 loader (over TFTP,
// or its http:// URL) with the per-machine GRUB config's URL as option
// 17; an arm64 iPXE is the fallback; with neither, no boot file and a
// reason that says what to run.
func TestChooseBootARM64(t *testing.T) {
	for name, tc := range map[string]struct {
		c        Client
		has      catalog
		kind     BootKind
		file     string
		rootPath string
		reason   string
	}{
		"PXE, GRUB":      {Client{MAC: "m", HasArch: true, Arch: 11, PXE: true}, catalog{images.GRUBARM64EFI: true, images.SNPArm64EFI: true}, BootTFTP, images.GRUBARM64EFI, "H/boot.grub?mac=m", "firmware PXE"},
		"PXE, iPXE only": {Client{MAC: "m", HasArch: true, Arch: 11, PXE: true}, catalog{images.SNPArm64EFI: true}, BootTFTP, images.SNPArm64EFI, "", "firmware PXE"},
		"PXE, none":      {Client{MAC: "m", HasArch: true, Arch: 11, PXE: true}, catalog{images.IPXEEFI: true}, BootNone, "", "", "images build --arch arm64"},
		"HTTP, GRUB":     {Client{MAC: "m", HasArch: true, Arch: 19, HTTP: true}, catalog{images.GRUBARM64EFI: true}, BootHTTP, "H/images/" + images.GRUBARM64EFI + "?mac=m", "H/boot.grub?mac=m", "HTTP Boot"},
		"HTTP, none":     {Client{MAC: "m", HasArch: true, Arch: 19, HTTP: true}, catalog{images.IPXEEFI: true}, BootNone, "", "", "images build --arch arm64"},
		"x64 gets no 17": {Client{MAC: "m", HasArch: true, Arch: 7, PXE: true}, catalog{images.IPXEEFI: true, images.GRUBARM64EFI: true}, BootTFTP, images.IPXEEFI, "", "firmware PXE"},
		"HTTP x64 no 17": {Client{MAC: "m", HasArch: true, Arch: 16, HTTP: true}, catalog{images.IPXEEFI: true, images.GRUBARM64EFI: true}, BootHTTP, "H/images/ipxe.efi?mac=m", "", "HTTP Boot"},
	} {
		b := ChooseBoot(tc.c, Env{HTTPBase: "H", Has: tc.has.Has})
		if b.Kind != tc.kind || b.File != tc.file || b.RootPath != tc.rootPath || !strings.Contains(b.Reason, tc.reason) {
			t.Errorf("%s: got %+v, want %s %q root path %q reason with %q", name, b, tc.kind, tc.file, tc.rootPath, tc.reason)
		}
	}
}

// TestARM64AnswerOnTheWire: an AAVMF PXE DISCOVER gets an OFFER naming
// GRUB's loader with the appliance as next-server and option 17 holding
// the GRUB config URL; without a loader in the catalog, an address and no
// boot file, and the timeline says why.
func TestARM64AnswerOnTheWire(t *testing.T) {
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Catalog = catalog{images.IPXEEFI: true, images.GRUBARM64EFI: true}
		c.HTTPBase = "http://10.0.0.1:8080"
	})
	offer, _ := f.do(t, discover(t, mac(0xa4), arm64PXE))
	if offer == nil || offer.BootFileName != images.GRUBARM64EFI || !offer.ServerIPAddr.Equal(serverIP.AsSlice()) {
		t.Fatalf("arm64 PXE offer: %v", offer)
	}
	if got, want := string(offer.Options.Get(dhcpv4.OptionRootPath)), "http://10.0.0.1:8080/boot.grub?mac="+mac(0xa4).String(); got != want {
		t.Errorf("option 17 = %q, want %q", got, want)
	}
	offer, _ = f.do(t, discover(t, mac(0xa5), arm64HTTP))
	if offer == nil || offer.BootFileName != "http://10.0.0.1:8080/images/"+images.GRUBARM64EFI+"?mac="+mac(0xa5).String() || len(offer.Options.Get(dhcpv4.OptionRootPath)) == 0 {
		t.Fatalf("arm64 HTTP offer: %v", offer)
	}

	g := newFixture(t, ModeFull, func(c *Config) { c.Catalog = catalog{images.IPXEEFI: true} })
	offer, _ = g.do(t, discover(t, mac(0xa6), arm64PXE))
	if offer == nil || offer.YourIPAddr.IsUnspecified() || offer.BootFileName != "" || offer.Options.Has(dhcpv4.OptionRootPath) {
		t.Fatalf("arm64 PXE offer without a loader: %v", offer)
	}
	if tl := g.timeline(t, mac(0xa6)); !strings.Contains(tl, "images build --arch arm64") {
		t.Errorf("timeline does not say why there is no boot file:\n%s", tl)
	}
}
