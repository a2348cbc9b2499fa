package guestimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/corralhq/corral/internal/elfroot"
	"github.com/corralhq/corral/internal/initramfs"
)

//go:embed scripts/efidisk.sh
var efiDiskScript []byte

// ARM64TinyAppend is the arm64 tiny guest's kernel command line (QEMU
// virt's PL011 serial console).
const ARM64TinyAppend = "console=ttyAMA0 loglevel=4"

// ARM64TinyTools are the host programs and files ARM64Tiny needs: apt
// with the arm64 architecture added (dpkg --add-architecture arm64) to
// download the arm64 packages, Debian's grub-efi-arm64-bin for the
// loader, and the disk tools.
var ARM64TinyTools = []string{"apt-get", "apt-cache", "dpkg-deb", "go", "grub-mkimage", "mkfs.vfat", "mcopy", "mmd", "sfdisk", "qemu-img", "bash",
	"/usr/lib/grub/arm64-efi/linux.mod"}

// arm64Packages are the arm64 packages the image is made of: Debian's
// cloud kernel (virtio, PL011, PCIe host: what QEMU's virt machine has),
// busybox-static, and dropbear with the libraries it links.
var arm64Packages = []string{"linux-image-cloud-arm64", "busybox-static", "dropbear-bin", "libc6", "libcrypt1", "libtomcrypt1", "libtommath1", "libgmp10", "zlib1g"}

// arm64Modules are the kernel modules the arm64 tiny init loads: virtio
// PCI, the virtio disk (the deploy's CIDATA seed partition, FAT), the
// SCSI CD-ROM (an arm64 node's VM seed: hypervisor/vm), the virtio NIC.
var arm64Modules = []string{
	"virtio", "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"virtio_blk", "fat", "vfat", "nls_cp437", "nls_ascii", "nls_utf8",
	"scsi_common", "scsi_mod", "cdrom", "sr_mod", "virtio_scsi",
	"failover", "net_failover", "virtio_net",
}

// ARM64Tiny returns the arm64 tiny guest image: a GPT disk whose EFI
// system partition holds GRUB (grub-mkimage -O arm64-efi, Debian's
// grub-efi-arm64-bin) as \EFI\BOOT\BOOTAA64.EFI, with an embedded config
// booting Debian's arm64 cloud kernel and an initramfs of tinyinit (built
// GOARCH=arm64), busybox-static:arm64 and dropbear-bin:arm64 with its
// libraries (resolved from the extracted arm64 packages by their ELF
// DT_NEEDED entries). UEFI firmware (AAVMF) boots it from the disk with
// no boot entries. tinyinit is a cloud-init subset, not Debian's
// cloud-init: it finds the NoCloud seed on a CIDATA disk partition, which
// is where Corral's deploy writes it, and does phone_home. It is built
// when the cache has none for the current inputs (packages' versions,
// init source, grub package, script), under the cache's flock.
func ARM64Tiny(ctx context.Context, cache string) (*Image, error) {
	if m := Missing(ARM64TinyTools); m != "" {
		return nil, fmt.Errorf("guestimage: %s is not installed", m)
	}
	unlock, err := lock(cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	root, err := arm64Root(ctx, cache)
	if err != nil {
		return nil, err
	}
	kernels, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return nil, fmt.Errorf("guestimage: arm64 kernel images in %s: %v", root, kernels)
	}
	initrd, err := arm64Initramfs(ctx, root)
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(kernels[0])
	if err != nil {
		return nil, err
	}
	grubVer, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Version}", "grub-efi-arm64-bin:arm64").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query grub-efi-arm64-bin:arm64: %w", err)
	}
	h := sha256.New()
	for _, part := range [][]byte{kb, initrd, []byte(ARM64TinyAppend), efiDiskScript, grubVer} {
		fmt.Fprintf(h, "%d\n", len(part))
		h.Write(part)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(cache, "guest-arm64tiny-"+sum+".qcow2")
	if _, err := os.Stat(out); err == nil {
		return &Image{Path: out, Hash: sum, Cached: true}, nil
	}
	tmp, err := os.MkdirTemp(cache, "tiny-arm64-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	initrdPath := filepath.Join(tmp, "initrd.img")
	if err := os.WriteFile(initrdPath, initrd, 0o644); err != nil {
		return nil, err
	}
	if err := runScript(ctx, tmp, efiDiskScript, kernels[0], initrdPath, ARM64TinyAppend, out); err != nil {
		return nil, err
	}
	prune(cache, "guest-arm64tiny-", out)
	return &Image{Path: out, Hash: sum}, nil
}

// arm64Root returns the arm64 packages (the kernel's versioned package
// for linux-image-cloud-arm64) extracted into one tree,
// cache/arm64-root-<key>, keyed by the packages' candidate versions;
// apt-get download fetches them the first time.
func arm64Root(ctx context.Context, cache string) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-cloud-arm64:arm64").Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-cloud-arm64:arm64 (dpkg --add-architecture arm64 and apt-get update first): %w", err)
	}
	var kpkg string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(v, "linux-image-") {
			kpkg = strings.TrimSuffix(v, ":arm64")
			break
		}
	}
	if kpkg == "" {
		return "", fmt.Errorf("cannot resolve linux-image-cloud-arm64:arm64: %s", out)
	}
	pkgs := append([]string{kpkg}, arm64Packages[1:]...)
	var specs []string
	for _, p := range pkgs {
		specs = append(specs, p+":arm64")
	}
	show, err := exec.CommandContext(ctx, "apt-cache", append([]string{"show", "--no-all-versions"}, specs...)...).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache show %v: %w", specs, err)
	}
	var vers []string
	for _, l := range strings.Split(string(show), "\n") {
		if strings.HasPrefix(l, "Package: ") || strings.HasPrefix(l, "Version: ") {
			vers = append(vers, l)
		}
	}
	sort.Strings(vers)
	h := sha256.Sum256([]byte(strings.Join(vers, "\n")))
	dir := filepath.Join(cache, "arm64-root-"+hex.EncodeToString(h[:])[:16])
	if _, err := os.Stat(filepath.Join(dir, "boot")); err == nil {
		return dir, nil
	}
	dl, err := os.MkdirTemp(cache, "dl-arm64-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dl)
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download"}, specs...)...)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %v: %w: %s", specs, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != len(specs) {
		return "", fmt.Errorf("apt-get download %v gave %v", specs, debs)
	}
	x := filepath.Join(dl, "x")
	for _, d := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", d, x).CombinedOutput(); err != nil {
			return "", fmt.Errorf("dpkg-deb -x %s: %w: %s", d, err, out)
		}
	}
	old, _ := filepath.Glob(filepath.Join(cache, "arm64-root-*"))
	for _, o := range old {
		os.RemoveAll(o)
	}
	if err := os.Rename(x, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// arm64Initramfs builds the gzip'd newc initramfs of the arm64 tiny guest
// from root (arm64Root's tree).
func arm64Initramfs(ctx context.Context, root string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "corral-tinyinit-arm64-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "init")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/corralhq/corral/testsupport/guestimage/tinyinit")
	if _, file, _, ok := runtime.Caller(0); ok {
		if st, err := os.Stat(filepath.Dir(file)); err == nil && st.IsDir() {
			cmd.Dir = filepath.Dir(file)
		}
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build tinyinit for arm64: %w: %s", err, out)
	}

	var cpioBuf bytes.Buffer
	w := initramfs.NewWriter(&cpioBuf)
	for _, d := range []string{"bin", "sbin", "etc", "dev", "proc", "sys", "tmp", "run", "root", "home", "modules", "usr", "usr/bin", "usr/sbin", "lib", "lib/aarch64-linux-gnu"} {
		w.Dir(d)
	}
	w.CharDev("dev/console", 0o600, 5, 1)
	add := func(dst, src string, mode uint32) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		w.File(dst, mode, b)
		return nil
	}
	if err := add("init", bin, 0o100755); err != nil {
		return nil, err
	}
	// busybox must be static; dropbear brings its loader and libraries,
	// resolved inside root (the unpacked arm64 packages).
	if files, err := elfroot.Closure(root, "arm64", []string{"bin/busybox"}); err != nil || len(files) != 1 {
		return nil, fmt.Errorf("%s is not a static arm64 executable (busybox-static:arm64): %v", filepath.Join(root, "bin", "busybox"), err)
	}
	if err := add("bin/busybox", filepath.Join(root, "bin", "busybox"), 0o104755); err != nil {
		return nil, err
	}
	files, err := elfroot.Closure(root, "arm64", []string{"usr/sbin/dropbear"})
	if err != nil {
		return nil, fmt.Errorf("dropbear's libraries among the arm64 packages %v: %w", arm64Packages, err)
	}
	// The initramfs has /lib/aarch64-linux-gnu (ld.so's default path) and
	// no /usr/lib: every library goes there; the program and its
	// interpreter keep their paths.
	for _, f := range files {
		dst := f.Dst
		if dst != "usr/sbin/dropbear" && !strings.HasPrefix(path.Base(dst), "ld-linux") {
			dst = "lib/aarch64-linux-gnu/" + path.Base(dst)
		}
		if err := add(dst, filepath.Join(root, f.Src), 0o100755); err != nil {
			return nil, err
		}
	}
	modRoot := filepath.Join(root, "lib", "modules")
	return finishInitramfs(w, &cpioBuf, add, modRoot, arm64Modules)
}
