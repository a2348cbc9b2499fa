package images

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/renameio/v2"
)

// Kind says what an artifact is for.
type Kind string

const (
	// KindIPXE is a first-stage iPXE binary (served over TFTP and HTTP).
	KindIPXE Kind = "ipxe"
	// KindKernel is a Linux kernel (bzImage) served over HTTP.
	KindKernel Kind = "kernel"
	// KindInitrd is an initramfs served over HTTP.
	KindInitrd Kind = "initrd"
	// KindLoader is a first-stage loader other than iPXE: the Secure
	// Boot chain's signed shim and GRUB (served over TFTP only with the
	// chain on) and GRUB's arm64 network image (served over TFTP and
	// HTTP like KindIPXE).
	KindLoader Kind = "loader"
)

// Names of the artifacts the boot servers know.
const (
	UndionlyKPXE = "undionly.kpxe" // BIOS, chainloads through the NIC's UNDI
	IPXEPXE      = "ipxe.pxe"      // BIOS, iPXE's native drivers
	IPXEEFI      = "ipxe.efi"      // x86-64 UEFI
	SNPOnlyEFI   = "snponly.efi"   // x86-64 UEFI through the firmware's SNP
	SNPArm64EFI  = "snp-arm64.efi" // arm64 UEFI (when shipped)
	// ShimX64EFI and GrubX64EFI are the Secure Boot chain's loaders:
	// Debian's shim signed by Microsoft's UEFI CA, and Debian's signed
	// network GRUB under the name shim loads next (docs/architecture.md,
	// "Secure Boot").
	ShimX64EFI = "shimx64.efi"
	GrubX64EFI = "grubx64.efi"
	// DiscoverKernel and DiscoverInitrd are the discover profile's kernel
	// and initramfs.
	DiscoverKernel = "vmlinuz"
	DiscoverInitrd = "initrd.img"
	// HypervisorInitrd is the hypervisor profile's initramfs; its kernel
	// is DiscoverKernel (both images are built from one kernel package).
	HypervisorInitrd = "hypervisor-initrd.img"
	// CommissionOverlay is the commissioning overlay (gzip'd cpio of the
	// test tools): a second initrd for a discovery boot with
	// commissioning pending, or fetched by the agent.
	CommissionOverlay = "commission-overlay.img"
)

// ErrNotFound means the name is not in the catalog.
var ErrNotFound = errors.New("images: no such artifact")

// Artifact is one catalog entry.
type Artifact struct {
	Name   string
	Kind   Kind
	Path   string
	Size   int64
	SHA256 string
}

// Source says where an artifact is copied from when the catalog is built.
type Source struct {
	Name string
	Kind Kind
	// Candidates are tried in order; the first that exists is copied.
	Candidates []string
	// Generate makes the file when no candidate exists (nil: the artifact
	// is optional and left out).
	Generate func(w io.Writer) error
}

// DebianIPXEDirs are where Debian's ipxe package puts its binaries.
var DebianIPXEDirs = []string{"/usr/lib/ipxe", "/boot"}

// DebianLoaderFiles are where Debian's shim-signed and
// grub-efi-amd64-signed packages put the Secure Boot chain's loaders, by
// catalog name: shim signed by Microsoft, and grubnetx64 (GRUB's network
// image, signed by Debian) served as the grubx64.efi shim asks for.
var DebianLoaderFiles = map[string]string{
	ShimX64EFI: "/usr/lib/shim/shimx64.efi.signed",
	GrubX64EFI: "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed",
}

// Config says what the catalog holds.
type Config struct {
	// Dir is the catalog directory (created; files are copied into it).
	Dir string
	// IPXEDirs are searched for the iPXE binaries (default: Dir's
	// ImportedIPXEDir, then DebianIPXEDirs).
	IPXEDirs []string
	// LoaderFiles are the signed Secure Boot loaders to copy, by catalog
	// name (ShimX64EFI, GrubX64EFI; corrald's --secure-boot gives
	// DebianLoaderFiles). Nil or a missing file: the catalog has none.
	LoaderFiles map[string]string
	// Kernel and Initrd are the discover profile's files; empty means the
	// built-in test stand-ins: Debian's ipxe.lkrn (a bzImage) as the
	// kernel and a small generated initramfs.
	Kernel, Initrd string
	// HypervisorInitrd is the hypervisor profile's initramfs; empty means
	// the catalog has none (machines with the hypervisor intent then boot
	// their local disk).
	HypervisorInitrd string
	// CommissionOverlay is the commissioning overlay; empty means the
	// catalog has none (commissioning needs the tools on the machine).
	CommissionOverlay string
	// ARM64Kernel, ARM64Initrd and ARM64Loader are the arm64 profile's
	// files (RegisterARM64); each empty one is left out of the catalog.
	ARM64Kernel, ARM64Initrd, ARM64Loader string
	// ARM64HypervisorInitrd is the arm64 hypervisor image's initramfs
	// (RegisterARM64Hypervisor); empty: left out.
	ARM64HypervisorInitrd string
}

// UsesTestImages reports whether Open would install a built-in test
// stand-in as the discover profile's kernel or initramfs: Kernel or
// Initrd is empty (after WithBuiltDiscover, nothing was built either).
func (c Config) UsesTestImages() bool { return c.Kernel == "" || c.Initrd == "" }

// Catalog is the read-only artifact set. It is immutable after Open and
// safe for concurrent use.
type Catalog struct {
	dir  string
	arts map[string]Artifact
}

// Open builds the catalog in cfg.Dir: it copies each artifact from its
// source when the copy is missing or differs in size, computes checksums
// and writes SHA256SUMS. It fails when no first-stage iPXE binary at all
// can be found.
func Open(cfg Config) (*Catalog, error) {
	if cfg.Dir == "" {
		return nil, errors.New("images: Config.Dir is required")
	}
	if len(cfg.IPXEDirs) == 0 {
		// The binaries an images archive brought (Import) first, then
		// Debian's ipxe package.
		cfg.IPXEDirs = append([]string{filepath.Join(cfg.Dir, ImportedIPXEDir)}, DebianIPXEDirs...)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	in := func(name string) []string {
		var out []string
		for _, d := range cfg.IPXEDirs {
			out = append(out, filepath.Join(d, name))
		}
		return out
	}
	srcs := []Source{
		{Name: UndionlyKPXE, Kind: KindIPXE, Candidates: in(UndionlyKPXE)},
		{Name: IPXEPXE, Kind: KindIPXE, Candidates: in(IPXEPXE)},
		{Name: IPXEEFI, Kind: KindIPXE, Candidates: in(IPXEEFI)},
		{Name: SNPOnlyEFI, Kind: KindIPXE, Candidates: in(SNPOnlyEFI)},
		{Name: SNPArm64EFI, Kind: KindIPXE, Candidates: in(SNPArm64EFI)},
	}
	for _, n := range []string{ShimX64EFI, GrubX64EFI} {
		var cand []string
		if f := cfg.LoaderFiles[n]; f != "" {
			cand = []string{f}
		}
		srcs = append(srcs, Source{Name: n, Kind: KindLoader, Candidates: cand})
	}
	kernel := Source{Name: DiscoverKernel, Kind: KindKernel, Candidates: in("ipxe.lkrn")}
	if cfg.Kernel != "" {
		kernel.Candidates = []string{cfg.Kernel}
	}
	initrd := Source{Name: DiscoverInitrd, Kind: KindInitrd, Generate: TestInitramfs}
	if cfg.Initrd != "" {
		initrd = Source{Name: DiscoverInitrd, Kind: KindInitrd, Candidates: []string{cfg.Initrd}}
	}
	hyp := Source{Name: HypervisorInitrd, Kind: KindInitrd}
	if cfg.HypervisorInitrd != "" {
		hyp.Candidates = []string{cfg.HypervisorInitrd}
	}
	overlay := Source{Name: CommissionOverlay, Kind: KindInitrd}
	if cfg.CommissionOverlay != "" {
		overlay.Candidates = []string{cfg.CommissionOverlay}
	}
	srcs = append(srcs, kernel, initrd, hyp, overlay)
	srcs = append(srcs, cfg.arm64Sources()...)
	c := &Catalog{dir: cfg.Dir, arts: map[string]Artifact{}}
	for _, s := range srcs {
		a, ok, err := install(cfg.Dir, s)
		if err != nil {
			return nil, err
		}
		if ok {
			c.arts[a.Name] = a
		}
	}
	if cfg.Kernel != "" && c.arts[DiscoverKernel].Name == "" {
		return nil, fmt.Errorf("images: kernel %s: %w", cfg.Kernel, os.ErrNotExist)
	}
	for _, n := range []struct{ path, name string }{{cfg.ARM64Kernel, ARM64Kernel}, {cfg.ARM64Initrd, ARM64Initrd}, {cfg.ARM64Loader, GRUBARM64EFI}, {cfg.ARM64HypervisorInitrd, ARM64HypervisorInitrd}} {
		if n.path != "" && c.arts[n.name].Name == "" {
			return nil, fmt.Errorf("images: %s %s: %w", n.name, n.path, os.ErrNotExist)
		}
	}
	if cfg.HypervisorInitrd != "" && c.arts[HypervisorInitrd].Name == "" {
		return nil, fmt.Errorf("images: hypervisor initramfs %s: %w", cfg.HypervisorInitrd, os.ErrNotExist)
	}
	if _, ok := c.arts[UndionlyKPXE]; !ok {
		if _, ok := c.arts[IPXEEFI]; !ok {
			return nil, fmt.Errorf("images: no iPXE binaries in %s: install Debian's ipxe package", strings.Join(cfg.IPXEDirs, ", "))
		}
	}
	if err := c.writeSums(); err != nil {
		return nil, err
	}
	return c, nil
}

// install copies (or generates) one artifact into dir. ok is false when an
// optional artifact has no source.
func install(dir string, s Source) (Artifact, bool, error) {
	dst := filepath.Join(dir, s.Name)
	var src string
	for _, c := range s.Candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			src = c
			break
		}
	}
	switch {
	case src != "":
		if err := copyIfChanged(src, dst); err != nil {
			return Artifact{}, false, err
		}
	case s.Generate != nil:
		if err := writeAtomic(dst, s.Generate); err != nil {
			return Artifact{}, false, err
		}
	default:
		// An optional artifact without a source: drop a stale copy.
		os.Remove(dst)
		return Artifact{}, false, nil
	}
	sum, size, err := checksum(dst)
	if err != nil {
		return Artifact{}, false, err
	}
	return Artifact{Name: s.Name, Kind: s.Kind, Path: dst, Size: size, SHA256: sum}, true, nil
}

func copyIfChanged(src, dst string) error {
	ss, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	if ds, err := os.Stat(dst); err == nil && ds.Size() == ss.Size() && !ds.ModTime().Before(ss.ModTime()) {
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	defer f.Close()
	return writeAtomic(dst, func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
}

// writeAtomic replaces dst, mode 0644, by what fill writes, through a
// synced temporary file in the same directory (renameio): readers see the
// old file or the new one, and a failed fill leaves dst untouched.
// writeManifest writes a built image's manifest v to path as indented
// JSON, atomically.
func writeManifest(path string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("images: %s: %w", filepath.Base(path), err)
	}
	return writeAtomic(path, func(w io.Writer) error {
		_, err := w.Write(append(js, '\n'))
		return err
	})
}

func writeAtomic(dst string, fill func(io.Writer) error) error {
	tmp, err := renameio.NewPendingFile(dst, renameio.WithTempDir(filepath.Dir(dst)), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	defer tmp.Cleanup()
	if err := fill(tmp); err != nil {
		return fmt.Errorf("images: write %s: %w", filepath.Base(dst), err)
	}
	if err := tmp.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	return nil
}

func checksum(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("images: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("images: %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func (c *Catalog) writeSums() error {
	var b strings.Builder
	for _, a := range c.List() {
		fmt.Fprintf(&b, "%s  %s\n", a.SHA256, a.Name)
	}
	return writeAtomic(filepath.Join(c.dir, "SHA256SUMS"), func(w io.Writer) error {
		_, err := io.WriteString(w, b.String())
		return err
	})
}

// Dir is the catalog directory.
func (c *Catalog) Dir() string { return c.dir }

// Lookup returns the artifact called name. Names are exact: no paths.
func (c *Catalog) Lookup(name string) (Artifact, bool) {
	a, ok := c.arts[name]
	return a, ok
}

// Has reports whether name is in the catalog.
func (c *Catalog) Has(name string) bool { _, ok := c.arts[name]; return ok }

// List returns every artifact in name order.
func (c *Catalog) List() []Artifact {
	out := make([]Artifact, 0, len(c.arts))
	for _, a := range c.arts {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Open opens an artifact for reading. It returns ErrNotFound for a name
// outside the catalog. The caller closes the file.
func (c *Catalog) Open(name string) (*os.File, Artifact, error) {
	a, ok := c.arts[name]
	if !ok {
		return nil, Artifact{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	f, err := os.Open(a.Path)
	if err != nil {
		return nil, Artifact{}, fmt.Errorf("images: %w", err)
	}
	return f, a, nil
}

func sortStrings(s []string) { sort.Strings(s) }
