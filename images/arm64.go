package images

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// The arm64 profile's artifacts (docs/architecture.md, "arm64"): its own
// discovery kernel and initramfs, and GRUB's arm64 network loader, which
// firmware PXE (arch 11) fetches over TFTP or UEFI HTTP boot (arch 19)
// over HTTP, and which then loads the kernel and initramfs over HTTP.
const (
	ARM64Kernel  = "vmlinuz-arm64"
	ARM64Initrd  = "initrd-arm64.img"
	GRUBARM64EFI = "grubnetaa64.efi"
	// ARM64HypervisorInitrd is the arm64 hypervisor image's initramfs
	// (its kernel is ARM64Kernel), served to arm64 machines only.
	ARM64HypervisorInitrd = "hypervisor-initrd-arm64.img"
)

// ARM64HypervisorManifest records the arm64 hypervisor image
// RegisterARM64Hypervisor registered.
const ARM64HypervisorManifest = "hypervisor-arm64.json"

// ARM64Manifest is the file in a catalog directory that records the arm64
// discovery image `corrald images build --arch arm64` registered there.
const ARM64Manifest = "discover-arm64.json"

// arm64Dir holds the registered arm64 files inside the catalog directory.
const arm64Dir = "discover-arm64"

// BuiltARM64 describes the registered arm64 discovery image and loader.
type BuiltARM64 struct {
	BuiltDiscover
	Loader       string `json:"loader"` // path inside the catalog directory
	LoaderSize   int64  `json:"loader_size"`
	LoaderSHA256 string `json:"loader_sha256"`
}

// RegisterARM64 copies the arm64 kernel, initramfs and GRUB loader into
// cfg.Dir's arm64 store, opens the catalog with them (ARM64Kernel,
// ARM64Initrd, GRUBARM64EFI, in SHA256SUMS) next to whatever else is
// registered, and records them in ARM64Manifest, which WithBuiltDiscover
// reads. It leaves the amd64 profiles as they are.
func RegisterARM64(cfg Config, kernel, initrd, loader, release, key string) (*Catalog, BuiltARM64, error) {
	if cfg.Dir == "" {
		return nil, BuiltARM64{}, fmt.Errorf("images: Config.Dir is required")
	}
	store := filepath.Join(cfg.Dir, arm64Dir)
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, BuiltARM64{}, fmt.Errorf("images: %w", err)
	}
	k, i, l := filepath.Join(store, "vmlinuz"), filepath.Join(store, "initrd.img"), filepath.Join(store, GRUBARM64EFI)
	for _, c := range [][2]string{{kernel, k}, {initrd, i}, {loader, l}} {
		if err := copyFileAtomic(c[0], c[1]); err != nil {
			return nil, BuiltARM64{}, err
		}
	}
	cfg = cfg.WithBuiltDiscover()
	cfg.ARM64Kernel, cfg.ARM64Initrd, cfg.ARM64Loader = k, i, l
	cat, err := Open(cfg)
	if err != nil {
		return nil, BuiltARM64{}, err
	}
	ka, _ := cat.Lookup(ARM64Kernel)
	ia, _ := cat.Lookup(ARM64Initrd)
	la, _ := cat.Lookup(GRUBARM64EFI)
	b := BuiltARM64{BuiltDiscover: BuiltDiscover{Kernel: filepath.Join(arm64Dir, "vmlinuz"), Initrd: filepath.Join(arm64Dir, "initrd.img"),
		KernelSize: ka.Size, InitrdSize: ia.Size, KernelSHA256: ka.SHA256, InitrdSHA256: ia.SHA256,
		Release: release, Key: key, Registered: time.Now().UTC()},
		Loader: filepath.Join(arm64Dir, GRUBARM64EFI), LoaderSize: la.Size, LoaderSHA256: la.SHA256}
	if err := writeManifest(filepath.Join(cfg.Dir, ARM64Manifest), b); err != nil {
		return nil, BuiltARM64{}, err
	}
	return cat, b, nil
}

// ReadBuiltARM64 reads dir's ARM64Manifest; ok is false when there is none
// or one of its files is gone.
func ReadBuiltARM64(dir string) (BuiltARM64, bool) {
	js, err := os.ReadFile(filepath.Join(dir, ARM64Manifest))
	if err != nil {
		return BuiltARM64{}, false
	}
	var b BuiltARM64
	if json.Unmarshal(js, &b) != nil || b.Kernel == "" || b.Initrd == "" || b.Loader == "" {
		return BuiltARM64{}, false
	}
	for _, p := range []string{b.Kernel, b.Initrd, b.Loader} {
		if st, err := os.Stat(filepath.Join(dir, p)); err != nil || !st.Mode().IsRegular() {
			return BuiltARM64{}, false
		}
	}
	return b, true
}

// withBuiltARM64 returns c with the arm64 files set from c.Dir's
// ARM64Manifest when none is set explicitly and one is registered.
func (c Config) withBuiltARM64() Config {
	if c.Dir == "" || c.ARM64Kernel != "" || c.ARM64Initrd != "" || c.ARM64Loader != "" {
		return c
	}
	if b, ok := ReadBuiltARM64(c.Dir); ok {
		c.ARM64Kernel, c.ARM64Initrd, c.ARM64Loader = filepath.Join(c.Dir, b.Kernel), filepath.Join(c.Dir, b.Initrd), filepath.Join(c.Dir, b.Loader)
		if h, ok := ReadBuiltARM64Hypervisor(c.Dir); ok && h.Release == b.Release && c.ARM64HypervisorInitrd == "" {
			c.ARM64HypervisorInitrd = filepath.Join(c.Dir, h.Initrd)
		}
	}
	return c
}

// RegisterARM64Hypervisor copies the arm64 hypervisor initramfs into
// cfg.Dir's arm64 store, opens the catalog with it (ARM64HypervisorInitrd)
// next to the rest, and records it in ARM64HypervisorManifest. Its kernel
// is the registered arm64 discovery kernel: release must be that
// kernel's (ErrKernelMismatch otherwise; RegisterARM64 first).
func RegisterARM64Hypervisor(cfg Config, initrd, release, key string) (*Catalog, BuiltHypervisor, error) {
	if cfg.Dir == "" {
		return nil, BuiltHypervisor{}, fmt.Errorf("images: Config.Dir is required")
	}
	d, ok := ReadBuiltARM64(cfg.Dir)
	if !ok || d.Release != release {
		return nil, BuiltHypervisor{}, fmt.Errorf("%w: arm64 hypervisor initramfs is for kernel %s, registered arm64 kernel is %q: register the arm64 discovery image built with it first", ErrKernelMismatch, release, d.Release)
	}
	dst := filepath.Join(cfg.Dir, arm64Dir, "hypervisor-initrd.img")
	if err := copyFileAtomic(initrd, dst); err != nil {
		return nil, BuiltHypervisor{}, err
	}
	cfg = cfg.WithBuiltDiscover()
	cfg.ARM64HypervisorInitrd = dst
	cat, err := Open(cfg)
	if err != nil {
		return nil, BuiltHypervisor{}, err
	}
	a, _ := cat.Lookup(ARM64HypervisorInitrd)
	h := BuiltHypervisor{Initrd: filepath.Join(arm64Dir, "hypervisor-initrd.img"), InitrdSize: a.Size, InitrdSHA256: a.SHA256,
		Release: release, Key: key, Registered: time.Now().UTC()}
	if err := writeManifest(filepath.Join(cfg.Dir, ARM64HypervisorManifest), h); err != nil {
		return nil, BuiltHypervisor{}, err
	}
	return cat, h, nil
}

// ReadBuiltARM64Hypervisor reads dir's ARM64HypervisorManifest; ok is
// false when there is none or its initramfs is gone.
func ReadBuiltARM64Hypervisor(dir string) (BuiltHypervisor, bool) {
	return readBuiltHypervisor(dir, ARM64HypervisorManifest)
}

// arm64Sources are the arm64 profile's catalog sources (each optional).
func (c Config) arm64Sources() []Source {
	src := func(name string, kind Kind, path string) Source {
		s := Source{Name: name, Kind: kind}
		if path != "" {
			s.Candidates = []string{path}
		}
		return s
	}
	return []Source{src(ARM64Kernel, KindKernel, c.ARM64Kernel), src(ARM64Initrd, KindInitrd, c.ARM64Initrd), src(GRUBARM64EFI, KindLoader, c.ARM64Loader),
		src(ARM64HypervisorInitrd, KindInitrd, c.ARM64HypervisorInitrd)}
}

func copyFileAtomic(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	defer f.Close()
	return writeAtomic(dst, func(w io.Writer) error { _, err := io.Copy(w, f); return err })
}
