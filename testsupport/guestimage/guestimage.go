// Package guestimage builds the two guest disk images Corral's end-to-end
// tests and benchmarks boot, from Debian packages, and caches them by
// content hash (in $CORRAL_TEST_CACHE, else ~/.cache/corral-test):
//
//   - Tiny: Debian's cloud kernel (apt-get download), an initramfs holding
//     a static Go /init (./tinyinit: reads the NoCloud seed from the CD-ROM
//     and applies hostname, user, SSH keys and static addresses), Debian's
//     busybox-static and dropbear, on a FAT partition booted by SYSLINUX
//     (scripts/syslinuxdisk.sh). About 20 MiB; boots to SSH in seconds
//     under TCG. TinyBoot gives the same kernel and initramfs for a
//     direct kernel boot (hypervisor/vm's tests).
//   - CloudInit: a Debian bookworm rootfs with the real cloud-init,
//     openssh-server and ifupdown from mmdebstrap on ext4, with a SYSLINUX
//     FAT boot partition (scripts/cloudimg.sh). Builds in minutes; ~430 MiB.
//   - SecureBootCloudInit: CloudInit with Debian's signed shim and GRUB in
//     its EFI system partition at \EFI\BOOT\ (scripts/sbesp.sh), so it
//     boots from disk under Secure Boot with Microsoft's keys. Derived from
//     the cached CloudInit image in seconds.
//   - ARM64Tiny: the tiny guest for arm64 UEFI (AAVMF): Debian's arm64
//     cloud kernel and the initramfs (tinyinit for GOARCH=arm64,
//     busybox-static:arm64, dropbear-bin:arm64 and its libraries, from
//     apt-get download through multiarch) on a GPT disk whose ESP holds
//     GRUB as \EFI\BOOT\BOOTAA64.EFI (scripts/efidisk.sh). tinyinit also
//     reads a NoCloud seed from a CIDATA disk partition (where Corral's
//     deploy writes it) and does phone_home: a cloud-init subset, not
//     Debian's cloud-init. About 33 MiB; builds in about 20 seconds.
//
// Both build without loop devices or mounts. Builders hold an flock on the
// cache directory so concurrent test packages build once.
package guestimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"github.com/corralhq/corral/internal/initramfs"
)

//go:embed scripts/syslinuxdisk.sh
var syslinuxDiskScript []byte

//go:embed scripts/cloudimg.sh
var cloudImgScript []byte

//go:embed scripts/sbesp.sh
var sbESPScript []byte

// TinyAppend is the tiny guest's kernel command line.
const TinyAppend = "console=ttyS0,115200 loglevel=4"

// Files the tiny initramfs takes from the host's Debian packages.
const (
	busyboxPath  = "/bin/busybox"       // busybox-static
	dropbearPath = "/usr/sbin/dropbear" // dropbear-bin
	mbrPath      = "/usr/lib/syslinux/mbr/mbr.bin"
)

// TinyTools, TinyBootTools and CloudInitTools are the host programs (and,
// named by absolute path, files) that Tiny, TinyBoot and CloudInit need.
var (
	TinyBootTools  = []string{"apt-get", "apt-cache", "dpkg-deb", "go", "ldd", busyboxPath, dropbearPath}
	TinyTools      = []string{"apt-get", "apt-cache", "dpkg-deb", "go", "ldd", "mkfs.vfat", "mcopy", "syslinux", "sfdisk", "qemu-img", "bash", busyboxPath, dropbearPath, mbrPath}
	CloudInitTools = []string{"mmdebstrap", "mkfs.vfat", "mcopy", "syslinux", "sfdisk", "mkfs.ext4", "qemu-img", "bash", mbrPath}
	// SecureBootTools adds the signed loaders SecureBootCloudInit puts in
	// the image's EFI system partition.
	SecureBootTools = append(append([]string{}, CloudInitTools...), "mmd", ShimSigned, GrubSigned)
)

// ShimSigned and GrubSigned are Debian's Secure Boot loaders for an
// installed system: shim (shim-signed, signed by Microsoft's UEFI CA) and
// the monolithic GRUB it loads (grub-efi-amd64-signed, signed by Debian).
const (
	ShimSigned = "/usr/lib/shim/shimx64.efi.signed"
	GrubSigned = "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"
)

// Kernel modules the tiny init loads: virtio PCI, the virtio-scsi CD-ROM
// holding the seed, the virtio NIC and the ACPI power button.
var tinyModules = []string{
	"virtio", "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"scsi_common", "scsi_mod", "cdrom", "sr_mod", "virtio_scsi",
	"button", "evdev", "failover", "net_failover", "virtio_net",
}

// Missing returns the first of tools (programs on PATH, or files named by
// absolute path) that this host lacks, or "".
func Missing(tools []string) string {
	for _, t := range tools {
		var err error
		if strings.HasPrefix(t, "/") {
			_, err = os.Stat(t)
		} else {
			_, err = exec.LookPath(t)
		}
		if err != nil {
			return t
		}
	}
	return ""
}

// CacheDir is $CORRAL_TEST_CACHE, else ~/.cache/corral-test.
func CacheDir() (string, error) {
	if d := os.Getenv("CORRAL_TEST_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "corral-test"), nil
}

// Image is a built (or cached) guest image.
type Image struct {
	Path   string // qcow2
	Hash   string // content hash (hex) naming it in the cache
	Cached bool   // reused from the cache
}

// lock takes an exclusive flock on cache/.lock.
func lock(cache string) (func(), error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	// Closing the file releases the lock whether or not LOCK_UN did.
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// Kernel returns Debian's cloud kernel image and module tree, fetched with
// apt-get download and unpacked into cache/<package> the first time (the
// layout Tiny and TinyBoot share).
func Kernel(ctx context.Context, cache string) (vmlinuz, modules string, err error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-cloud-amd64").Output()
	if err != nil {
		return "", "", fmt.Errorf("apt-cache depends linux-image-cloud-amd64: %w", err)
	}
	var pkg string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(v, "linux-image-") {
			pkg = v
			break
		}
	}
	if pkg == "" {
		return "", "", fmt.Errorf("cannot resolve linux-image-cloud-amd64: %s", out)
	}
	dir := filepath.Join(cache, pkg)
	if _, err := os.Stat(filepath.Join(dir, "boot")); err != nil {
		dl, err := os.MkdirTemp(cache, "dl-")
		if err != nil {
			return "", "", err
		}
		defer os.RemoveAll(dl)
		cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
		cmd.Dir = dl
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("apt-get download %s: %w: %s", pkg, err, out)
		}
		debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
		if len(debs) != 1 {
			return "", "", fmt.Errorf("apt-get download %s gave %v", pkg, debs)
		}
		x := filepath.Join(dl, "x")
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], x).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("dpkg-deb -x: %w: %s", err, out)
		}
		if err := os.Rename(x, dir); err != nil && !errors.Is(err, fs.ErrExist) {
			if _, serr := os.Stat(filepath.Join(dir, "boot")); serr != nil {
				return "", "", err
			}
		}
	}
	kernels, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return "", "", fmt.Errorf("kernel images in %s: %v", dir, kernels)
	}
	return kernels[0], filepath.Join(dir, "lib", "modules"), nil
}

// Tiny returns the tiny guest image, building it when the cache has no
// image for the current inputs (kernel, init source, busybox, dropbear and
// its libraries, boot script).
func Tiny(ctx context.Context, cache string) (*Image, error) {
	if m := Missing(TinyTools); m != "" {
		return nil, fmt.Errorf("guestimage: %s is not installed", m)
	}
	unlock, err := lock(cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	kernel, modRoot, err := Kernel(ctx, cache)
	if err != nil {
		return nil, err
	}
	initrd, err := tinyInitramfs(ctx, modRoot)
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(kernel)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, part := range [][]byte{kb, initrd, []byte(TinyAppend), syslinuxDiskScript} {
		fmt.Fprintf(h, "%d\n", len(part))
		h.Write(part)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(cache, "guest-tiny-"+sum+".qcow2")
	if _, err := os.Stat(out); err == nil {
		return &Image{Path: out, Hash: sum, Cached: true}, nil
	}
	tmp, err := os.MkdirTemp(cache, "tiny-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	initrdPath := filepath.Join(tmp, "initrd.img")
	if err := os.WriteFile(initrdPath, initrd, 0o644); err != nil {
		return nil, err
	}
	if err := runScript(ctx, tmp, syslinuxDiskScript, kernel, initrdPath, TinyAppend, out); err != nil {
		return nil, err
	}
	prune(cache, "guest-tiny-", out)
	return &Image{Path: out, Hash: sum}, nil
}

// TinyBoot returns the tiny guest for a direct kernel boot (QEMU -kernel
// and -initrd): Debian's cloud kernel and the gzip'd initramfs the Tiny
// image boots (tinyinit, its modules, busybox and dropbear).
func TinyBoot(ctx context.Context, cache string) (kernel string, initrd []byte, err error) {
	if m := Missing(TinyBootTools); m != "" {
		return "", nil, fmt.Errorf("guestimage: %s is not installed", m)
	}
	unlock, err := lock(cache)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	kernel, modRoot, err := Kernel(ctx, cache)
	if err != nil {
		return "", nil, err
	}
	initrd, err = tinyInitramfs(ctx, modRoot)
	if err != nil {
		return "", nil, err
	}
	return kernel, initrd, nil
}

// CloudInit returns the real cloud-init image, building it with
// mmdebstrap when the cache has none for the current build script and
// mirror (the Debian archive moves; delete the cache file to rebuild).
func CloudInit(ctx context.Context, cache string) (*Image, error) {
	if m := Missing(CloudInitTools); m != "" {
		return nil, fmt.Errorf("guestimage: %s is not installed", m)
	}
	unlock, err := lock(cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	h := sha256.New()
	h.Write(cloudImgScript)
	fmt.Fprintf(h, "\nmirror=%s\n", os.Getenv("CORRAL_DEBIAN_MIRROR"))
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(cache, "guest-cloudinit-"+sum+".qcow2")
	if _, err := os.Stat(out); err == nil {
		return &Image{Path: out, Hash: sum, Cached: true}, nil
	}
	tmp, err := os.MkdirTemp(cache, "cloudimg-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := runScript(ctx, tmp, cloudImgScript, out); err != nil {
		return nil, err
	}
	prune(cache, "guest-cloudinit-", out)
	return &Image{Path: out, Hash: sum}, nil
}

// SecureBootCloudInit returns the CloudInit image with a Secure Boot
// chain in its EFI system partition (scripts/sbesp.sh): shim at
// \EFI\BOOT\BOOTX64.EFI, Debian's signed GRUB beside it as grubx64.efi,
// and a GRUB configuration booting the image's own kernel — Debian's
// cloud kernel, signed by Debian — so UEFI firmware with Microsoft's keys
// and Secure Boot on boots it from the disk with no boot entries. The
// loaders are the host's (ShimSigned, GrubSigned). It is derived from the
// cached CloudInit image in seconds (no second mmdebstrap) and cached
// under its own name, keyed by the base image and both loaders; BIOS
// boots it by SYSLINUX as before.
func SecureBootCloudInit(ctx context.Context, cache string) (*Image, error) {
	if m := Missing(SecureBootTools); m != "" {
		return nil, fmt.Errorf("guestimage: %s is not installed", m)
	}
	base, err := CloudInit(ctx, cache)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(sbESPScript)
	fmt.Fprintf(h, "\nbase=%s\n", base.Hash)
	for _, p := range []string{ShimSigned, GrubSigned} {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	unlock, err := lock(cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := filepath.Join(cache, "guest-sbcloud-"+sum+".qcow2")
	if _, err := os.Stat(out); err == nil {
		return &Image{Path: out, Hash: sum, Cached: true}, nil
	}
	tmp, err := os.MkdirTemp(cache, "sbesp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := runScript(ctx, tmp, sbESPScript, ShimSigned, GrubSigned, base.Path, out); err != nil {
		return nil, err
	}
	prune(cache, "guest-sbcloud-", out)
	return &Image{Path: out, Hash: sum}, nil
}

// prune removes the cached images of one kind other than keep (built from
// older inputs).
func prune(cache, prefix, keep string) {
	old, _ := filepath.Glob(filepath.Join(cache, prefix+"*.qcow2"))
	for _, p := range old {
		if p != keep {
			os.Remove(p)
		}
	}
}

func runScript(ctx context.Context, dir string, script []byte, args ...string) error {
	p := filepath.Join(dir, "build.sh")
	if err := os.WriteFile(p, script, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{p}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		o := buf.String()
		if len(o) > 4000 {
			o = "..." + o[len(o)-4000:]
		}
		return fmt.Errorf("guestimage: %s: %w\n%s", filepath.Base(args[len(args)-1]), err, o)
	}
	return nil
}

// tinyInitramfs builds the gzip'd newc initramfs of the tiny guest.
func tinyInitramfs(ctx context.Context, modRoot string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "corral-tinyinit-")
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
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build tinyinit: %w: %s", err, out)
	}

	var cpioBuf bytes.Buffer
	w := initramfs.NewWriter(&cpioBuf)
	for _, d := range []string{"bin", "sbin", "etc", "dev", "proc", "sys", "tmp", "run", "root", "home", "modules", "usr", "usr/bin", "usr/sbin", "lib", "lib64", "lib/x86_64-linux-gnu"} {
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
	if out, _ := exec.Command("ldd", busyboxPath).CombinedOutput(); !bytes.Contains(out, []byte("not a dynamic executable")) && !bytes.Contains(out, []byte("statically linked")) {
		return nil, fmt.Errorf("%s is not static (install busybox-static): %s", busyboxPath, out)
	}
	// setuid root: busybox drops privileges except for applets that
	// need them, like ping (Debian's busybox ping opens a raw socket, so
	// the login user could not ping otherwise).
	if err := add("bin/busybox", busyboxPath, 0o104755); err != nil {
		return nil, err
	}
	if err := add("usr/sbin/dropbear", dropbearPath, 0o100755); err != nil {
		return nil, err
	}
	libs, err := SharedLibs(dropbearPath)
	if err != nil {
		return nil, err
	}
	for _, l := range libs {
		if err := add(strings.TrimPrefix(l, "/"), l, 0o100755); err != nil {
			return nil, err
		}
	}
	return finishInitramfs(w, &cpioBuf, add, modRoot, tinyModules)
}

// finishInitramfs adds the named kernel modules found under modRoot to w
// (as modules/NAME.ko, via add), closes w and returns cpio gzip'd.
func finishInitramfs(w *initramfs.Writer, cpio *bytes.Buffer, add func(dst, src string, mode uint32) error, modRoot string, modules []string) ([]byte, error) {
	// The walk skips what it cannot read and so never fails; a module it
	// missed is named below.
	found := map[string]string{}
	_ = filepath.WalkDir(modRoot, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			found[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return nil
	})
	for _, m := range modules {
		p, ok := found[m]
		if !ok {
			return nil, fmt.Errorf("module %s not in %s", m, modRoot)
		}
		if err := add("modules/"+m+".ko", p, 0o100644); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(cpio.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return gz.Bytes(), nil
}

// SharedLibs lists the absolute paths ldd resolves for bins (the loader
// included), each once, sorted.
func SharedLibs(bins ...string) ([]string, error) {
	set := map[string]bool{}
	for _, bin := range bins {
		out, err := exec.Command("ldd", bin).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", bin, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(l) {
				if strings.HasPrefix(f, "/") {
					set[f] = true
				}
			}
		}
	}
	libs := make([]string, 0, len(set))
	for l := range set {
		libs = append(libs, l)
	}
	sort.Strings(libs)
	return libs, nil
}
