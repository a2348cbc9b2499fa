package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// A foreign architecture's host files (docs/architecture.md, "arm64"):
// Debian's packages for that architecture and their dependency closure,
// unpacked with `mmdebstrap --variant=extract` (apt resolves the
// dependencies; nothing is configured, no maintainer script runs, so no
// binfmt_misc is needed) into a root of their own, from which the image
// takes the files it needs and their ELF closure (elfroot.Closure).

// ARM64DiscoverPackages are the arm64 packages of the arm64 discovery
// image's host files (DiscoverHostFiles' counterparts: mke2fs, mdadm,
// lvm, mkswap), so an arm64 machine can be installed.
var ARM64DiscoverPackages = []string{"e2fsprogs", "mdadm", "lvm2", "util-linux", "libc6"}

// ARM64HypervisorPackages are what the arm64 hypervisor image adds:
// qemu-system-aarch64 (qemu-system-arm) and qemu-img (qemu-utils).
var ARM64HypervisorPackages = []string{"qemu-system-arm", "qemu-utils"}

// ARM64HypervisorHostFiles are the arm64 hypervisor image's additions
// to DiscoverHostFiles. Debian 12's QEMU builds TCG into
// qemu-system-aarch64 (only the x86 targets have an accel-tcg module to
// dlopen), so there is no module to add.
var ARM64HypervisorHostFiles = []string{"/usr/bin/qemu-system-aarch64", "/usr/bin/qemu-img"}

// ARM64QEMUFirmware are the data files the arm64 node's QEMU loads for
// hypervisor/vm.Args' arm64 machine (virt, virtio-net-pci's option ROM,
// VNC's keymap). They are architecture-independent (ipxe-qemu,
// qemu-system-data) and come from the build host.
var ARM64QEMUFirmware = []string{"efi-virtio.rom", "keymaps/en-us"}

// ARM64UEFIFirmware is the UEFI firmware an arm64 node's guests boot
// from their disks through (hypervisor/vm DefaultARM64Firmware, -bios):
// EDK2 for virt as one 2 MiB image, from the build host's
// ARM64UEFIPackage (architecture-independent; AAVMF's pflash volumes
// would be 64 MiB each).
var ARM64UEFIFirmware = []string{"/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"}

// ARM64UEFIPackage ships ARM64UEFIFirmware; its version is in the arm64
// hypervisor image's manifest and key.
const ARM64UEFIPackage = "qemu-efi-aarch64"

// sysrootDir is the cache's directory of unpacked roots of arch.
func sysrootDir(cacheDir, arch string) string { return filepath.Join(cacheDir, arch, "sysroot") }

// Sysroot is an unpacked foreign root.
type Sysroot struct {
	Dir string `json:"-"`
	// Packages are the versions of every package unpacked (the
	// requested ones and their dependencies).
	Packages map[string]string `json:"packages"`
}

// FetchSysroot returns the root holding pkgs of arch and their
// dependencies, unpacked by mmdebstrap from the host's apt sources
// (suite: the host's release), from the cache when the candidate
// versions apt names for pkgs are unchanged. It blocks for the download
// (about 100 s and 300 MB unpacked for QEMU's closure). Callers hold the
// cache's lock.
func FetchSysroot(ctx context.Context, log *slog.Logger, cacheDir, arch string, pkgs []string) (Sysroot, error) {
	want := append([]string(nil), pkgs...)
	sort.Strings(want)
	h := sha256.New()
	fmt.Fprintf(h, "mmdebstrap extract %s\n", arch)
	for _, p := range want {
		m, err := aptShow(ctx, p+":"+arch)
		if err != nil {
			return Sysroot{}, err
		}
		fmt.Fprintf(h, "%s %s\n", p, m["Version"])
	}
	key := hex.EncodeToString(h.Sum(nil))
	dir := filepath.Join(sysrootDir(cacheDir, arch), key)
	if b, err := os.ReadFile(filepath.Join(dir, "manifest.json")); err == nil {
		var s Sysroot
		if json.Unmarshal(b, &s) == nil && len(s.Packages) > 0 {
			s.Dir = filepath.Join(dir, "root")
			return s, nil
		}
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return Sysroot{}, fmt.Errorf("%s host files: mmdebstrap not found (apt-get install mmdebstrap)", arch)
	}
	suite, err := hostSuite()
	if err != nil {
		return Sysroot{}, err
	}
	if err := os.MkdirAll(sysrootDir(cacheDir, arch), 0o755); err != nil {
		return Sysroot{}, err
	}
	tmp, err := os.MkdirTemp(sysrootDir(cacheDir, arch), ".fetch-")
	if err != nil {
		return Sysroot{}, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	args := []string{"--quiet", "--variant=extract", "--architectures=" + arch, "--include=" + strings.Join(want, ","),
		"--skip=cleanup/apt/cache", suite, root}
	args = append(args, aptSources()...)
	t := time.Now()
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Stdin = nil // mmdebstrap reads sources from stdin when none are given and stdin is not a tty
	if out, err := cmd.CombinedOutput(); err != nil {
		return Sysroot{}, fmt.Errorf("mmdebstrap (%s: %s): %v: %s", arch, strings.Join(want, " "), err, lastLines(out, 20))
	}
	s := Sysroot{Packages: map[string]string{}}
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		// name_version_arch.deb, with the version's ':' escaped as %3a.
		f := strings.Split(strings.TrimSuffix(filepath.Base(d), ".deb"), "_")
		if len(f) == 3 {
			s.Packages[f[0]] = strings.ReplaceAll(f[1], "%3a", ":")
		}
	}
	for _, p := range want {
		if s.Packages[p] == "" {
			return Sysroot{}, fmt.Errorf("mmdebstrap (%s): %s was not unpacked", arch, p)
		}
	}
	os.RemoveAll(filepath.Join(root, "var/cache/apt/archives"))
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), b, 0o644); err != nil {
		return Sysroot{}, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return Sysroot{}, err
	}
	pruneBuilds(sysrootDir(cacheDir, arch), key, 2, log) // ~300 MB each
	log.Info("foreign packages unpacked", "arch", arch, "packages", len(s.Packages), "took", time.Since(t).Round(time.Second))
	s.Dir = filepath.Join(dir, "root")
	return s, nil
}

// hostSuite is the host's Debian release (VERSION_CODENAME).
func hostSuite() (string, error) {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok && v != "" {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", fmt.Errorf("/etc/os-release names no VERSION_CODENAME")
}

// aptSources are the host's apt source files, which mmdebstrap takes
// as its mirrors (the same archive and security updates apt uses).
func aptSources() []string {
	var out []string
	if st, err := os.Stat("/etc/apt/sources.list"); err == nil && st.Size() > 0 {
		out = append(out, "/etc/apt/sources.list")
	}
	for _, g := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(g)
		out = append(out, m...)
	}
	return out
}

func lastLines(b []byte, n int) string {
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
