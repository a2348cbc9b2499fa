package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GRUBARM64Dir is where Debian's grub-efi-arm64-bin puts GRUB's arm64 EFI
// modules.
const GRUBARM64Dir = "/usr/lib/grub/arm64-efi"

// GRUBARM64Modules are the modules built into the arm64 network loader:
// the firmware's NIC (efinet), DHCP options, HTTP, the Linux loader with
// gzip (Debian's arm64 vmlinuz is a gzip'd Image) and the script commands
// of GRUBEmbeddedConfig and of the per-machine config boot/http renders.
// The local-disk answer (boot/http's localdisk) finds the ESP's
// \EFI\BOOT\BOOTAA64.EFI (search, part_gpt, part_msdos, fat) and chainloads
// it (chain); minicmd has exit, which the embedded config ends with.
var GRUBARM64Modules = []string{"efinet", "net", "http", "linux", "gzio", "normal", "configfile", "echo", "regexp", "sleep", "test", "halt", "reboot",
	"search", "part_gpt", "part_msdos", "fat", "chain", "minicmd"}

// GRUBEmbeddedConfig is the loader's built-in config. GRUB runs it with
// its rescue parser (no if or for), after efinet has configured the NIC
// the firmware booted from with the firmware's DHCP answer. That answer's
// option 17 (root path) holds the per-machine config's http:// URL
// (boot/dhcp puts it there for arm64 clients), which GRUB's http module
// reads as (http,host:port)/path. A fetch that fails is tried again, up
// to grubConfigAttempts times 5 s apart (unrolled: no loops here): GRUB
// numbers its TCP source ports from the same value on every boot, so a
// machine that reboots within minutes of its last network boot (a VM, or
// the reboot after an install) opens the connection its previous boot
// left open, which the appliance holds until its idle timeout (GRUB never
// closes the config's connection) and answers with the old connection's
// ACK; the next attempt's port is the next one. (The per-machine config
// retries its kernel and initramfs the same way, and boot/http resets
// GRUB's connections as it closes them: docs/architecture.md, "arm64".)
// After the last, exit (minicmd) hands the machine back to the firmware.
var GRUBEmbeddedConfig = grubEmbeddedConfig(grubConfigAttempts)

// grubConfigAttempts is how many times the embedded config fetches the
// per-machine config: more than the connections one network boot opens
// (config, kernel, initramfs), so one attempt uses a port the previous
// boot did not.
const grubConfigAttempts = 6

func grubEmbeddedConfig(attempts int) string {
	var b strings.Builder
	b.WriteString(`net_get_dhcp_option corral_url "$net_default_interface" 17 string
regexp --set=1:corral_host --set=2:corral_path '^http://([^/]+)(/.*)$' "$corral_url"
echo "Corral: loading $corral_url"
`)
	for i := 1; i <= attempts; i++ {
		b.WriteString("configfile \"(http,$corral_host)$corral_path\"\n")
		if i < attempts {
			fmt.Fprintf(&b, "echo \"Corral: no boot config from $corral_url (attempt %d of %d); again in 5 s\"\nsleep 5\n", i, attempts)
		}
	}
	b.WriteString(`echo "Corral: no boot config (DHCP option 17 is '$corral_url'); back to the firmware in 10 s"
sleep 10
exit
`)
	return b.String()
}

// BuildGRUBARM64 writes GRUB's arm64 network loader (grub-mkimage from
// Debian's grub-efi-arm64-bin, GRUBARM64Modules, GRUBEmbeddedConfig) to
// cacheDir/arm64/grub/<key>/grubnetaa64.efi, or returns it from there when
// the package version, modules and config are unchanged.
func BuildGRUBARM64(ctx context.Context, cacheDir string) (string, error) {
	if _, err := os.Stat(filepath.Join(GRUBARM64Dir, "efinet.mod")); err != nil {
		return "", fmt.Errorf("no GRUB arm64 modules in %s: install Debian's grub-efi-arm64-bin (dpkg --add-architecture arm64 first)", GRUBARM64Dir)
	}
	ver, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Version}", "grub-efi-arm64-bin:arm64").Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-query grub-efi-arm64-bin: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s", ver, strings.Join(GRUBARM64Modules, " "), GRUBEmbeddedConfig)
	key := hex.EncodeToString(h.Sum(nil))
	dir := filepath.Join(cacheDir, ArchARM64, "grub", key)
	out := filepath.Join(dir, "grubnetaa64.efi")
	if st, err := os.Stat(out); err == nil && st.Size() > 0 {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cfg := filepath.Join(dir, "embedded.cfg")
	if err := os.WriteFile(cfg, []byte(GRUBEmbeddedConfig), 0o644); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	args := append([]string{"-O", "arm64-efi", "-d", GRUBARM64Dir, "-p", "/corral", "-c", cfg, "-o", tmp}, GRUBARM64Modules...)
	if b, err := exec.CommandContext(ctx, "grub-mkimage", args...).CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("grub-mkimage not found: install Debian's grub-common")
		}
		return "", fmt.Errorf("grub-mkimage: %v\n%s", err, b)
	}
	return out, os.Rename(tmp, out)
}
