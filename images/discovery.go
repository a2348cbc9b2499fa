package images

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// DiscoverManifest is the file in a catalog directory that records the
// discovery image `corrald images build` registered there.
const DiscoverManifest = "discover.json"

// builtDir holds the registered discovery kernel and initramfs inside the
// catalog directory (the catalog copies them to vmlinuz and initrd.img).
const builtDir = "discover"

// BuiltDiscover describes the registered discovery image.
type BuiltDiscover struct {
	Kernel       string    `json:"kernel"` // paths inside the catalog directory
	Initrd       string    `json:"initrd"`
	KernelSize   int64     `json:"kernel_size"`
	InitrdSize   int64     `json:"initrd_size"`
	KernelSHA256 string    `json:"kernel_sha256"`
	InitrdSHA256 string    `json:"initrd_sha256"`
	Release      string    `json:"kernel_release,omitempty"`
	Key          string    `json:"cache_key,omitempty"`
	Registered   time.Time `json:"registered"`
}

// RegisterDiscover copies kernel and initrd into cfg.Dir's discovery
// store, opens the catalog with them as the discover profile's files (so
// their size and SHA-256 are in SHA256SUMS) and records them in
// DiscoverManifest, which WithBuiltDiscover reads: `corrald serve` on the
// same data directory then boots unknown machines into them.
func RegisterDiscover(cfg Config, kernel, initrd, release, key string) (*Catalog, BuiltDiscover, error) {
	if cfg.Dir == "" {
		return nil, BuiltDiscover{}, fmt.Errorf("images: Config.Dir is required")
	}
	store := filepath.Join(cfg.Dir, builtDir)
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, BuiltDiscover{}, fmt.Errorf("images: %w", err)
	}
	// Whatever registers now replaces an imported image (Import writes
	// the record again after this).
	if err := os.Remove(filepath.Join(cfg.Dir, ImportRecord)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, BuiltDiscover{}, fmt.Errorf("images: %w", err)
	}
	k, i := filepath.Join(store, DiscoverKernel), filepath.Join(store, DiscoverInitrd)
	for _, c := range [][2]string{{kernel, k}, {initrd, i}} {
		f, err := os.Open(c[0])
		if err != nil {
			return nil, BuiltDiscover{}, fmt.Errorf("images: %w", err)
		}
		err = writeAtomic(c[1], func(w io.Writer) error { _, err := io.Copy(w, f); return err })
		f.Close()
		if err != nil {
			return nil, BuiltDiscover{}, err
		}
	}
	cfg.Kernel, cfg.Initrd = k, i
	cfg = cfg.withBuiltARM64()
	if cfg.HypervisorInitrd == "" {
		// Keep a registered hypervisor image of the same kernel.
		if h, ok := ReadBuiltHypervisor(cfg.Dir); ok && h.Release == release {
			cfg.HypervisorInitrd = filepath.Join(cfg.Dir, h.Initrd)
		}
	}
	cat, err := Open(cfg)
	if err != nil {
		return nil, BuiltDiscover{}, err
	}
	ka, _ := cat.Lookup(DiscoverKernel)
	ia, _ := cat.Lookup(DiscoverInitrd)
	b := BuiltDiscover{Kernel: filepath.Join(builtDir, DiscoverKernel), Initrd: filepath.Join(builtDir, DiscoverInitrd),
		KernelSize: ka.Size, InitrdSize: ia.Size, KernelSHA256: ka.SHA256, InitrdSHA256: ia.SHA256,
		Release: release, Key: key, Registered: time.Now().UTC()}
	if err := writeManifest(filepath.Join(cfg.Dir, DiscoverManifest), b); err != nil {
		return nil, BuiltDiscover{}, err
	}
	return cat, b, nil
}

// ReadBuiltDiscover reads dir's DiscoverManifest; ok is false when there
// is none or its files are gone.
func ReadBuiltDiscover(dir string) (BuiltDiscover, bool) {
	js, err := os.ReadFile(filepath.Join(dir, DiscoverManifest))
	if err != nil {
		return BuiltDiscover{}, false
	}
	var b BuiltDiscover
	if json.Unmarshal(js, &b) != nil || b.Kernel == "" || b.Initrd == "" {
		return BuiltDiscover{}, false
	}
	for _, p := range []string{b.Kernel, b.Initrd} {
		if st, err := os.Stat(filepath.Join(dir, p)); err != nil || !st.Mode().IsRegular() {
			return BuiltDiscover{}, false
		}
	}
	return b, true
}

// WithBuiltDiscover returns c with Kernel and Initrd set to the discovery
// image registered in c.Dir (RegisterDiscover) when neither is set
// explicitly and one is registered, and HypervisorInitrd set to the
// hypervisor image registered there (RegisterHypervisor) when it is not
// set explicitly and was built from the same kernel as the discovery
// image in use (a registered one; with an explicit kernel, none, since
// its modules could not match); otherwise c unchanged.
//
// It also sets the arm64 profile's files from the image registered in
// c.Dir (RegisterARM64) when none of them is set.
func (c Config) WithBuiltDiscover() Config {
	if c.Dir == "" {
		return c
	}
	c = c.withBuiltARM64()
	explicit := c.Kernel != "" || c.Initrd != ""
	b, ok := ReadBuiltDiscover(c.Dir)
	if !explicit && ok {
		c.Kernel, c.Initrd = filepath.Join(c.Dir, b.Kernel), filepath.Join(c.Dir, b.Initrd)
	}
	if c.CommissionOverlay == "" && ok {
		if o, ook := ReadBuiltCommission(c.Dir); ook {
			c.CommissionOverlay = filepath.Join(c.Dir, o.Overlay)
		}
	}
	if c.HypervisorInitrd == "" && !explicit && ok {
		if h, hok := ReadBuiltHypervisor(c.Dir); hok && h.Release == b.Release {
			c.HypervisorInitrd = filepath.Join(c.Dir, h.Initrd)
		}
	}
	return c
}

// HypervisorManifest is the file in a catalog directory that records the
// hypervisor image `corrald images build` registered there.
const HypervisorManifest = "hypervisor.json"

// hypervisorDir holds the registered hypervisor initramfs inside the
// catalog directory.
const hypervisorDir = "hypervisor"

// BuiltHypervisor describes the registered hypervisor image. Its kernel
// is the registered discovery kernel (Release must match).
type BuiltHypervisor struct {
	Initrd       string    `json:"initrd"` // path inside the catalog directory
	InitrdSize   int64     `json:"initrd_size"`
	InitrdSHA256 string    `json:"initrd_sha256"`
	Release      string    `json:"kernel_release"`
	Key          string    `json:"cache_key,omitempty"`
	Registered   time.Time `json:"registered"`
}

// ErrKernelMismatch means the hypervisor image was built for another kernel
// than the registered discovery image's.
var ErrKernelMismatch = errors.New("images: hypervisor image and discovery kernel differ")

// RegisterHypervisor copies initrd into cfg.Dir's hypervisor store, opens
// the catalog with it as the hypervisor profile's initramfs (size and
// SHA-256 in SHA256SUMS) and records it in HypervisorManifest, which
// WithBuiltDiscover reads. The hypervisor profile boots the discovery
// kernel, so a discovery image of the same kernel release must be
// registered first (RegisterDiscover); otherwise it fails with
// ErrKernelMismatch.
func RegisterHypervisor(cfg Config, initrd, release, key string) (*Catalog, BuiltHypervisor, error) {
	if cfg.Dir == "" {
		return nil, BuiltHypervisor{}, fmt.Errorf("images: Config.Dir is required")
	}
	d, ok := ReadBuiltDiscover(cfg.Dir)
	if !ok || d.Release != release {
		return nil, BuiltHypervisor{}, fmt.Errorf("%w: hypervisor initramfs is for kernel %s, registered discovery kernel is %q: register the discovery image built with it first", ErrKernelMismatch, release, d.Release)
	}
	store := filepath.Join(cfg.Dir, hypervisorDir)
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, BuiltHypervisor{}, fmt.Errorf("images: %w", err)
	}
	dst := filepath.Join(store, HypervisorInitrd)
	f, err := os.Open(initrd)
	if err != nil {
		return nil, BuiltHypervisor{}, fmt.Errorf("images: %w", err)
	}
	err = writeAtomic(dst, func(w io.Writer) error { _, err := io.Copy(w, f); return err })
	f.Close()
	if err != nil {
		return nil, BuiltHypervisor{}, err
	}
	cfg.HypervisorInitrd = dst
	cat, err := Open(cfg.WithBuiltDiscover())
	if err != nil {
		return nil, BuiltHypervisor{}, err
	}
	a, _ := cat.Lookup(HypervisorInitrd)
	h := BuiltHypervisor{Initrd: filepath.Join(hypervisorDir, HypervisorInitrd), InitrdSize: a.Size, InitrdSHA256: a.SHA256,
		Release: release, Key: key, Registered: time.Now().UTC()}
	if err := writeManifest(filepath.Join(cfg.Dir, HypervisorManifest), h); err != nil {
		return nil, BuiltHypervisor{}, err
	}
	return cat, h, nil
}

// ReadBuiltHypervisor reads dir's HypervisorManifest; ok is false when
// there is none or its initramfs is gone.
func ReadBuiltHypervisor(dir string) (BuiltHypervisor, bool) {
	return readBuiltHypervisor(dir, HypervisorManifest)
}

// readBuiltHypervisor reads the hypervisor manifest dir/manifest (either
// architecture's); ok is false when there is none or its initramfs is gone.
func readBuiltHypervisor(dir, manifest string) (BuiltHypervisor, bool) {
	js, err := os.ReadFile(filepath.Join(dir, manifest))
	if err != nil {
		return BuiltHypervisor{}, false
	}
	var h BuiltHypervisor
	if json.Unmarshal(js, &h) != nil || h.Initrd == "" {
		return BuiltHypervisor{}, false
	}
	if st, err := os.Stat(filepath.Join(dir, h.Initrd)); err != nil || !st.Mode().IsRegular() {
		return BuiltHypervisor{}, false
	}
	return h, true
}
