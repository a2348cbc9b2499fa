package facts

import (
	"os"
	"path/filepath"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// TestCollectSecureBoot reads the Secure Boot state from captured sysfs
// files: the efivars variable first, the boot parameters' byte without
// efivarfs, nothing on a BIOS boot; and the lockdown mode.
func TestCollectSecureBoot(t *testing.T) {
	params := func(v byte) []byte { b := make([]byte, 4096); b[bootParamsSecureBoot] = v; return b }
	for name, tc := range map[string]struct {
		files    map[string][]byte
		want     inventoryv1.Facts_SecureBoot
		lockdown string
	}{
		"efivars on": {map[string][]byte{"sys/firmware/efi/x": nil, secureBootVar: {6, 0, 0, 0, 1},
			"sys/kernel/security/lockdown": []byte("none [integrity] confidentiality\n")}, inventoryv1.Facts_SECURE_BOOT_ENABLED, "integrity"},
		"efivars off": {map[string][]byte{secureBootVar: {6, 0, 0, 0, 0},
			"sys/kernel/security/lockdown": []byte("[none] integrity confidentiality\n")}, inventoryv1.Facts_SECURE_BOOT_DISABLED, "none"},
		"boot params on":    {map[string][]byte{"sys/firmware/efi/x": nil, "sys/kernel/boot_params/data": params(3)}, inventoryv1.Facts_SECURE_BOOT_ENABLED, ""},
		"boot params off":   {map[string][]byte{"sys/firmware/efi/x": nil, "sys/kernel/boot_params/data": params(2)}, inventoryv1.Facts_SECURE_BOOT_DISABLED, ""},
		"boot params unset": {map[string][]byte{"sys/firmware/efi/x": nil, "sys/kernel/boot_params/data": params(0)}, inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED, ""},
		"short variable":    {map[string][]byte{secureBootVar: {1}}, inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED, ""},
		"BIOS":              {map[string][]byte{"sys/kernel/boot_params/data": params(3), "sys/kernel/security/lockdown": []byte("garbage [x]")}, inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED, ""},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			for p, b := range tc.files {
				full := filepath.Join(root, p)
				os.MkdirAll(filepath.Dir(full), 0o755)
				if err := os.WriteFile(full, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f := &inventoryv1.Facts{}
			if err := collectSecureBoot(Options{Root: root}, f); err != nil {
				t.Fatal(err)
			}
			if f.GetSecureBoot() != tc.want || f.GetLockdown() != tc.lockdown {
				t.Errorf("got %v %q, want %v %q", f.GetSecureBoot(), f.GetLockdown(), tc.want, tc.lockdown)
			}
		})
	}
}

// TestCapSecureBoot: a state or lockdown mode outside the known values
// (a hostile or newer agent) is cleared.
func TestCapSecureBoot(t *testing.T) {
	f := Cap(&inventoryv1.Facts{SecureBoot: 77, Lockdown: "integrity\x1b[31m"})
	if f.GetSecureBoot() != inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED || f.GetLockdown() != "" {
		t.Errorf("got %v %q", f.GetSecureBoot(), f.GetLockdown())
	}
	f = Cap(&inventoryv1.Facts{SecureBoot: inventoryv1.Facts_SECURE_BOOT_ENABLED, Lockdown: "integrity"})
	if f.GetSecureBoot() != inventoryv1.Facts_SECURE_BOOT_ENABLED || f.GetLockdown() != "integrity" {
		t.Errorf("got %v %q", f.GetSecureBoot(), f.GetLockdown())
	}
}
