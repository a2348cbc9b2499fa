package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Packages are the Debian 12 packages the lab runs on: QEMU and its
// firmware (SeaBIOS with the iPXE ROMs, OVMF), Debian's iPXE binaries,
// OpenIPMI's ipmi_sim, iproute2, and what `corrald images build` needs to
// build the discovery image (apt-get download, dpkg-deb, depmod, xz,
// pci.ids).
var Packages = []string{"iproute2", "qemu-system-x86", "qemu-utils", "ovmf", "ipxe", "openipmi", "ipmitool",
	"kmod", "xz-utils", "pci.ids", "ca-certificates"}

// requiredFiles maps a file or program the lab needs to its package.
var requiredFiles = map[string]string{
	"ip":                      "iproute2",
	"qemu-system-x86_64":      "qemu-system-x86",
	"qemu-img":                "qemu-utils",
	ovmfCode:                  "ovmf",
	"/usr/lib/ipxe/ipxe.efi":  "ipxe",
	"ipmi_sim":                "openipmi",
	"ipmitool":                "ipmitool",
	"/usr/sbin/depmod":        "kmod",
	"xz":                      "xz-utils",
	"/usr/share/misc/pci.ids": "pci.ids",
}

// missingPackages returns the packages whose files are absent.
func missingPackages() []string {
	seen := map[string]bool{}
	var out []string
	for f, pkg := range requiredFiles {
		ok := false
		if strings.HasPrefix(f, "/") {
			_, err := os.Stat(f)
			ok = err == nil
		} else {
			_, err := exec.LookPath(f)
			ok = err == nil
		}
		if !ok && !seen[pkg] {
			seen[pkg] = true
			out = append(out, pkg)
		}
	}
	return out
}

// ensurePackages installs missing packages with apt-get when allowed.
func ensurePackages(ctx context.Context, install bool, w io.Writer) error {
	miss := missingPackages()
	if len(miss) == 0 {
		return nil
	}
	if !install {
		return fmt.Errorf("missing packages: %s (apt-get install -y %s, or run without --install-deps=false)", strings.Join(miss, " "), strings.Join(Packages, " "))
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("missing packages %s and no apt-get to install them", strings.Join(miss, " "))
	}
	fmt.Fprintf(w, "installing %s (apt-get)\n", strings.Join(Packages, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, Packages...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v\n%s", args[0], err, tail(string(out), 2000))
		}
	}
	if miss := missingPackages(); len(miss) > 0 {
		return fmt.Errorf("still missing after apt-get install: %s", strings.Join(miss, " "))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
