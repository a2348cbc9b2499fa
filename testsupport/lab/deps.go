package lab

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Packages are the Debian 12 packages the lab runs on: QEMU and its
// firmware (SeaBIOS with the iPXE ROMs, OVMF), Debian's iPXE binaries,
// OpenIPMI's ipmi_sim, iproute2, and what `corrald images build` needs to
// build the discovery image (apt-get download, dpkg-deb, depmod, zstd and
// xz, pci.ids, and the host files it carries: mke2fs, mdadm, lvm and
// mkswap), and swtpm for the machines' TPMs.
var Packages = []string{"iproute2", "qemu-system-x86", "qemu-utils", "ovmf", "ipxe", "openipmi", "ipmitool",
	"kmod", "zstd", "xz-utils", "pci.ids", "ca-certificates", "swtpm", "e2fsprogs", "mdadm", "lvm2"}

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
	"zstd":                    "zstd",
	"xz":                      "xz-utils",
	"/usr/share/misc/pci.ids": "pci.ids",
	"swtpm":                   "swtpm",
	"/usr/sbin/mke2fs":        "e2fsprogs",
	"/usr/sbin/mdadm":         "mdadm",
	"/usr/sbin/lvm":           "lvm2",
}

// FleetPackages are what a fleet lab (--appliances 2 or more) needs
// beside Packages: etcd's server.
var FleetPackages = []string{"etcd-server"}

// fleetFiles maps what a fleet lab needs to its package.
var fleetFiles = map[string]string{"etcd": "etcd-server"}

// missingPackages returns the packages whose files are absent.
func missingPackages(fleet bool) []string {
	seen := map[string]bool{}
	var out []string
	need := maps.Clone(requiredFiles)
	if fleet {
		maps.Copy(need, fleetFiles)
	}
	for f, pkg := range need {
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

// ensurePackages installs missing packages with apt-get when allowed
// (with fleet, etcd's too).
func ensurePackages(ctx context.Context, install, fleet bool, w io.Writer) error {
	miss := missingPackages(fleet)
	if len(miss) == 0 {
		return nil
	}
	pkgs := Packages
	if fleet {
		pkgs = append(slices.Clone(Packages), FleetPackages...)
	}
	if !install {
		return fmt.Errorf("missing packages: %s (apt-get install -y %s, or run without --install-deps=false)", strings.Join(miss, " "), strings.Join(pkgs, " "))
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("missing packages %s and no apt-get to install them", strings.Join(miss, " "))
	}
	fmt.Fprintf(w, "installing %s (apt-get)\n", strings.Join(pkgs, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v\n%s", args[0], err, tail(string(out), 2000))
		}
	}
	if miss := missingPackages(fleet); len(miss) > 0 {
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
