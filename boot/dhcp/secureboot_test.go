package dhcp

import (
	"testing"

	"github.com/corralhq/corral/images"
)

// TestChooseBootSecureBoot: with Env.SecureBoot, x64 UEFI firmware PXE
// gets shim (which loads grubx64.efi), never iPXE; UEFI HTTP boot of x64
// gets no boot file (the signed GRUB fetches over TFTP only); BIOS and
// iPXE clients are answered as before.
func TestChooseBootSecureBoot(t *testing.T) {
	chain := catalog{images.UndionlyKPXE: true, images.IPXEEFI: true, images.SNPOnlyEFI: true, images.ShimX64EFI: true, images.GrubX64EFI: true}
	noGrub := catalog{images.IPXEEFI: true, images.SNPOnlyEFI: true, images.ShimX64EFI: true}
	for name, tc := range map[string]struct {
		cat  catalog
		c    Client
		kind BootKind
		file string
	}{
		"arch 7":          {chain, Client{HasArch: true, Arch: 7, PXE: true}, BootTFTP, images.ShimX64EFI},
		"arch 9":          {chain, Client{HasArch: true, Arch: 9, PXE: true}, BootTFTP, images.ShimX64EFI},
		"arch 7 no grub":  {noGrub, Client{HasArch: true, Arch: 7, PXE: true}, BootNone, ""},
		"arch 7 no shim":  {catalog{images.GrubX64EFI: true, images.SNPOnlyEFI: true}, Client{HasArch: true, Arch: 7, PXE: true}, BootNone, ""},
		"arch 16 refused": {chain, Client{MAC: "m", HTTP: true, HasArch: true, Arch: 16}, BootNone, ""},
		"BIOS unchanged":  {chain, Client{HasArch: true, Arch: 0, PXE: true}, BootTFTP, images.UndionlyKPXE},
		"iPXE unchanged":  {chain, Client{MAC: "m", IPXE: true, HasArch: true, Arch: 7}, BootScript, "Sm"},
	} {
		env := Env{ScriptURL: func(m string) string { return "S" + m }, HTTPBase: "H", Has: tc.cat.Has, SecureBoot: true}
		b := ChooseBoot(tc.c, env)
		if b.Kind != tc.kind || b.File != tc.file || b.Reason == "" {
			t.Errorf("%s: got %+v, want %s %q", name, b, tc.kind, tc.file)
		}
	}
}
