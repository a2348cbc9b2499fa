package facts

import (
	"errors"
	"io/fs"
	"os"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// secureBootVar is the UEFI global variable SecureBoot (8be4df61-...): 4
// bytes of attributes, then one byte, 1 when Secure Boot is on.
const secureBootVar = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d0-aa0d-00a0c90f0b8c"

// bootParamsSecureBoot is struct boot_params' secure_boot byte (x86:
// 0 unset, 1 unknown, 2 disabled, 3 enabled), readable in sysfs without
// efivarfs mounted.
const bootParamsSecureBoot = 0x1ec

// collectSecureBoot reads the Secure Boot state (the efivars variable,
// else the kernel's boot parameters) and the lockdown mode. A BIOS boot
// has neither and is left unspecified.
func collectSecureBoot(opts Options, f *inventoryv1.Facts) error {
	f.Lockdown = lockdownMode(readAttr(opts.path("sys/kernel/security/lockdown")))
	if _, err := os.Stat(opts.path("sys/firmware/efi")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // BIOS
		}
		return err
	}
	if b, err := os.ReadFile(opts.path(secureBootVar)); err == nil && len(b) == 5 {
		f.SecureBoot = inventoryv1.Facts_SECURE_BOOT_DISABLED
		if b[4] == 1 {
			f.SecureBoot = inventoryv1.Facts_SECURE_BOOT_ENABLED
		}
		return nil
	}
	if b, err := os.ReadFile(opts.path("sys/kernel/boot_params/data")); err == nil && len(b) > bootParamsSecureBoot {
		switch b[bootParamsSecureBoot] {
		case 2:
			f.SecureBoot = inventoryv1.Facts_SECURE_BOOT_DISABLED
		case 3:
			f.SecureBoot = inventoryv1.Facts_SECURE_BOOT_ENABLED
		}
	}
	return nil
}

// lockdownMode is the bracketed word of the lockdown file ("none
// [integrity] confidentiality"), or "" for anything else.
func lockdownMode(s string) string {
	for _, w := range strings.Fields(s) {
		switch w {
		case "[none]", "[integrity]", "[confidentiality]":
			return w[1 : len(w)-1]
		}
	}
	return ""
}
