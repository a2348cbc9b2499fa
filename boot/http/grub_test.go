package http

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

var (
	grubClient = netip.MustParseAddr("10.0.0.100")
	grubHost   = netip.MustParseAddr("10.0.0.1")
)

// TestGrubConfigGolden: the Secure Boot chain's GRUB configuration for
// each intent, with the iPXE script's kernel command line (less its
// initrd= words) over TFTP.
func TestGrubConfigGolden(t *testing.T) {
	f := newFixture(t, nil)
	for name, mac := range map[string]string{
		"discover":   "52:54:00:00:00:01",
		"local":      "52:54:00:00:00:02",
		"hypervisor": "52:54:00:00:00:03",
	} {
		t.Run(name, func(t *testing.T) {
			body, err := f.s.GrubConfig(context.Background(), mac, grubClient, grubHost)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("testdata", name+".grub.cfg"), body)
		})
	}
	if got := f.rec.all(); strings.Count(got, " http grub-config ") != 3 {
		t.Errorf("timeline:\n%s", got)
	}
}

// TestGrubConfigEscapes: a machine name and kernel arguments carrying
// quotes, semicolons and newlines stay single quoted words: no GRUB
// command can be injected.
func TestGrubConfigEscapes(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.KernelArgs = `console=ttyS0 x='a;b' $y` })
	f.inv.machines["52:54:00:00:00:09"] = &inventoryv1.Machine{Name: "evil'\nreboot\n#", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_LOCAL}
	body, err := f.s.GrubConfig(context.Background(), "52:54:00:00:00:09", grubClient, grubHost)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.TrimSpace(line) == "reboot" {
			t.Errorf("a machine name became a command:\n%s", body)
		}
	}
	if !strings.Contains(string(body), `echo 'Corral: evil'\''\x0areboot\x0a# boots from its local disk'`) {
		t.Errorf("name not quoted as one word:\n%s", body)
	}
	body, err = f.s.GrubConfig(context.Background(), "52:54:00:00:00:01", grubClient, grubHost)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `'x='\''a;b'\''' '$y'`) {
		t.Errorf("kernel arguments not quoted word by word:\n%s", body)
	}
}

// TestGrubConfigLeaseRule: as the script, a MAC's GRUB configuration
// goes only to the address leased to that MAC.
func TestGrubConfigLeaseRule(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Leases = fakeLeases{grubClient: "52:54:00:00:00:02"} })
	if _, err := f.s.GrubConfig(context.Background(), "52:54:00:00:00:02", grubClient, grubHost); err != nil {
		t.Fatalf("holder refused: %v", err)
	}
	_, err := f.s.GrubConfig(context.Background(), "52:54:00:00:00:01", grubClient, grubHost)
	if !errors.Is(err, ErrGrubRefused) || !strings.Contains(err.Error(), "leased to 52:54:00:00:00:02") {
		t.Errorf("err = %v", err)
	}
	_, err = f.s.GrubConfig(context.Background(), "52:54:00:00:00:01", netip.MustParseAddr("10.0.0.200"), grubHost)
	if !errors.Is(err, ErrGrubRefused) {
		t.Errorf("no lease: err = %v", err)
	}
}

// TestGrubConfigLocalDisk: both answers that mean "boot the local disk"
// (the local intent, and any intent with a problem) chainload the first
// ESP's removable-media loader, and only then exit: Debian's GRUB exits
// with EFI_SUCCESS, after which EDK2 shows its boot menu instead of
// trying the next boot option.
func TestGrubConfigLocalDisk(t *testing.T) {
	const chain = "if search --no-floppy --file --set=root /EFI/BOOT/BOOTX64.EFI; then\n  chainloader /EFI/BOOT/BOOTX64.EFI\n  boot\nfi\nexit\n"
	for _, d := range []ScriptData{
		{Intent: "local", Machine: "m-1", MAC: "52:54:00:00:00:01"},
		{Intent: "hypervisor", Machine: "m-2", MAC: "52:54:00:00:00:02", Problem: "the catalog has no hypervisor image"},
	} {
		b, err := RenderGrub(d)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), chain) || strings.Contains(string(b), "linux ") {
			t.Errorf("%s (problem %q): want the local disk's chainload at the end, no kernel:\n%s", d.Intent, d.Problem, b)
		}
	}
}
