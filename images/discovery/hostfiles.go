package discovery

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/corralhq/corral/internal/elfroot"
	"github.com/u-root/mkuimage/ldd"
)

// DiscoverHostFiles are the host's Debian files the discovery image
// carries at the same paths: mke2fs formats the data disk at install
// (docs/architecture.md, step 6) and a deploy's other filesystems; mdadm,
// lvm and mkswap apply a deploy's disk layout (docs/architecture.md, "The
// agent's deploy"). ELF files bring their shared libraries (ldd).
var DiscoverHostFiles = []string{"/usr/sbin/mke2fs", "/etc/mke2fs.conf", "/usr/sbin/mdadm", "/usr/sbin/lvm", "/usr/sbin/mkswap"}

// DiscoverPackages are the Debian packages DiscoverHostFiles come from;
// their versions are recorded in the manifest (the cache key hashes the
// files themselves).
var DiscoverPackages = []string{"e2fsprogs", "libc6", "mdadm", "lvm2", "util-linux"}

// HypervisorHostFiles are what the hypervisor image adds (docs/architecture.md,
// step 7): QEMU and qemu-img from qemu-system-x86 and qemu-utils, and
// QEMU's TCG accelerator, which Debian builds as a module QEMU dlopens
// (ldd cannot see it): without it a node without usable KVM cannot start
// a VM.
var HypervisorHostFiles = []string{
	"/usr/bin/qemu-system-x86_64",
	"/usr/bin/qemu-img",
	"/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so",
}

// HypervisorPackages are the Debian packages of HypervisorHostFiles and
// QEMUFirmware; their versions are part of the hypervisor image's key.
var HypervisorPackages = []string{"qemu-system-x86", "qemu-system-common", "qemu-system-data", "qemu-utils", "seabios", "ipxe-qemu"}

// QEMUFirmware are the files QEMU loads from its firmware path to start
// the node's guests (hypervisor/vm.Args: q35, or pc for the KVM probe,
// -device VGA, virtio-net, virtio-blk, virtio-scsi, -kernel/-initrd
// direct boot, VNC), found with strace on Debian 12's QEMU 7.2: SeaBIOS
// (bios-256k.bin) and the std VGA's BIOS, the KVM vAPIC option ROM, the
// direct-kernel-boot ROMs, iPXE's virtio-net ROM and VNC's default keymap.
// Nothing else: hypervisor/vm attaches no other device, so the e1000 ROMs,
// the other VGA BIOSes and the 128 KiB bios.bin of old machine types
// (0.77 MB) are not carried (every MB is fetched, hashed, loaded and
// unpacked on each hypervisor boot).
var QEMUFirmware = []string{
	"bios-256k.bin", "vgabios-stdvga.bin",
	"kvmvapic.bin", "linuxboot.bin", "linuxboot_dma.bin", "multiboot.bin", "multiboot_dma.bin", "pvh.bin",
	"efi-virtio.rom",
	"keymaps/en-us",
}

// defaultFirmwareDirs is Debian's QEMU firmware path (`qemu-system-x86_64
// -L help`), used when asking QEMU fails.
var defaultFirmwareDirs = []string{"/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe/qemu"}

// hostFile is a file copied from the host: Src (symlinks resolved) to
// Dst (relative to the image root).
type hostFile struct{ Src, Dst string }

func (f hostFile) extra() string { return f.Src + ":" + f.Dst }

// resolveHostFiles returns paths at their own locations (symlinks
// resolved) and firmware names found in QEMU's firmware path.
func resolveHostFiles(ctx context.Context, paths, firmware []string) ([]hostFile, error) {
	var out []hostFile
	for _, p := range paths {
		src, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (install the Debian package that ships it)", p, err)
		}
		out = append(out, hostFile{Src: src, Dst: strings.TrimPrefix(filepath.Clean(p), "/")})
	}
	if len(firmware) == 0 {
		return out, nil
	}
	dirs := firmwareDirs(ctx)
	for _, n := range firmware {
		found := false
		for _, d := range dirs {
			p := filepath.Join(d, n)
			src, err := filepath.EvalSymlinks(p)
			if err != nil {
				continue
			}
			if st, err := os.Stat(src); err != nil || !st.Mode().IsRegular() {
				continue
			}
			out = append(out, hostFile{Src: src, Dst: strings.TrimPrefix(p, "/")})
			found = true
			break
		}
		if !found {
			return nil, fmt.Errorf("QEMU firmware %s not in %s: install qemu-system-x86 (seabios, ipxe-qemu, qemu-system-data)", n, strings.Join(dirs, ", "))
		}
	}
	return out, nil
}

// firmwareDirs asks QEMU for its firmware path.
func firmwareDirs(ctx context.Context) []string {
	out, err := exec.CommandContext(ctx, "qemu-system-x86_64", "-L", "help").Output()
	if err != nil {
		return defaultFirmwareDirs
	}
	var dirs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if d := strings.TrimSpace(sc.Text()); filepath.IsAbs(d) {
			dirs = append(dirs, filepath.Clean(d))
		}
	}
	if len(dirs) == 0 {
		return defaultFirmwareDirs
	}
	return dirs
}

// hostFilesHash hashes the files and the shared libraries ldd resolves
// for them (paths and contents): a library upgrade changes the key.
func hostFilesHash(files []hostFile) (string, error) {
	type ent struct{ dst, src string }
	var all []ent
	seen := map[string]bool{}
	for _, f := range files {
		all = append(all, ent{f.Dst, f.Src})
		libs, err := ldd.FList(f.Src)
		if err != nil {
			return "", fmt.Errorf("ldd %s: %w", f.Src, err)
		}
		for _, l := range libs {
			if !seen[l] {
				seen[l] = true
				all = append(all, ent{strings.TrimPrefix(l, "/"), l})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].dst < all[j].dst })
	h := sha256.New()
	for _, e := range all {
		st, err := os.Lstat(e.src)
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			l, _ := os.Readlink(e.src)
			fmt.Fprintf(h, "%s -> %s\n", e.dst, l)
			continue
		}
		f, err := os.Open(e.src)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", e.dst, st.Size())
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// packageVersions asks dpkg for the installed versions of pkgs.
func packageVersions(ctx context.Context, pkgs []string) (map[string]string, error) {
	if len(pkgs) == 0 {
		return nil, nil
	}
	args := append([]string{"-W", "-f", "${Package} ${Version}\n"}, pkgs...)
	out, err := exec.CommandContext(ctx, "dpkg-query", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query %s: %v: %s (install them with apt-get)", strings.Join(pkgs, " "), err, stderrOf(err))
	}
	v := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if p, ver, ok := strings.Cut(l, " "); ok && ver != "" {
			v[p] = ver
		}
	}
	for _, p := range pkgs {
		if v[p] == "" {
			return nil, fmt.Errorf("the Debian package %s is not installed: apt-get install %s", p, p)
		}
	}
	return v, nil
}

// foreignHostFiles are rc's paths and their ELF closure from the
// unpacked root of o.Arch's Debian packages (one root for every profile
// of the architecture: ARM64DiscoverPackages and ARM64HypervisorPackages),
// and rc's firmware and data, which are architecture-independent, from
// the build host. It returns the files and the root's package versions.
func foreignHostFiles(ctx context.Context, o Options, rc recipe) ([]hostFile, map[string]string, error) {
	sr, err := FetchSysroot(ctx, o.Logger, o.CacheDir, o.Arch, append(append([]string(nil), ARM64DiscoverPackages...), ARM64HypervisorPackages...))
	if err != nil {
		return nil, nil, err
	}
	closure, err := elfroot.Closure(sr.Dir, o.Arch, rc.paths)
	if err != nil {
		return nil, nil, err
	}
	files := make([]hostFile, 0, len(closure)+len(rc.firmware))
	for _, f := range closure {
		files = append(files, hostFile{Src: filepath.Join(sr.Dir, filepath.FromSlash(f.Src)), Dst: f.Dst})
	}
	fw, err := resolveHostFiles(ctx, rc.data, rc.firmware)
	if err != nil {
		return nil, nil, err
	}
	return append(files, fw...), sr.Packages, nil
}

// filesHash hashes files (paths and contents) as they are: a foreign
// closure is complete already (no ldd).
func filesHash(files []hostFile) (string, error) {
	all := append([]hostFile(nil), files...)
	sort.Slice(all, func(i, j int) bool { return all[i].Dst < all[j].Dst })
	h := sha256.New()
	for _, e := range all {
		f, err := os.Open(e.Src)
		if err != nil {
			return "", err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", e.Dst, st.Size())
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
