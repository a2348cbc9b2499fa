package images

import (
	"archive/tar"
	"bufio"
	"bytes"
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
	"time"
)

// An images archive is the release's prebuilt catalog: one uncompressed
// tar (the initramfs images are compressed already) holding the discovery
// kernel and initramfs, the hypervisor initramfs when registered, the iPXE
// binaries, ArchiveManifest (what each file is) and SHA256SUMS over every
// other file, manifest included. Export writes one from a catalog that
// `corrald images build` registered; Import checks it whole and registers
// it exactly as the build would, so an appliance installed from the
// package boots machines with neither Go nor a Debian mirror.

// ArchiveManifest is the manifest's name inside an images archive.
const ArchiveManifest = "MANIFEST.json"

// ArchiveFormat is the manifest's format version.
const ArchiveFormat = 1

// ImportedIPXEDir holds the iPXE binaries an archive brought, inside the
// catalog directory. Open looks there first when Config.IPXEDirs is empty.
const ImportedIPXEDir = "ipxe"

// ImportRecord is the file in a catalog directory that says its images
// came from an archive (Import); RegisterDiscover removes it, so a
// catalog built locally afterwards is not taken for an imported one.
const ImportRecord = "imported.json"

// Bounds on an archive: at most maxArchiveEntries files; the manifest and
// SHA256SUMS are small text files.
const (
	maxArchiveEntries = 32
	maxManifestBytes  = 1 << 20
)

// ErrArchive means an images archive that is not one (unknown or duplicate
// files, a missing manifest or SHA256SUMS, a file they do not list).
var ErrArchive = errors.New("images: not a valid images archive")

// ArchiveEntry is one file of an archive as its manifest records it.
type ArchiveEntry struct {
	Name   string `json:"name"`
	Kind   Kind   `json:"kind"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes an archive's images.
type Manifest struct {
	Format        int            `json:"format"`
	Created       time.Time      `json:"created"`
	Version       string         `json:"corral_version,omitempty"`
	KernelRelease string         `json:"kernel_release"`
	DiscoverKey   string         `json:"discover_key,omitempty"`
	HypervisorKey string         `json:"hypervisor_key,omitempty"`
	Files         []ArchiveEntry `json:"files"`
}

// Meter is told how far long work is (internal/progress's Reporter is
// one; a nil *Reporter inside prints nothing).
type Meter interface {
	Stage(name string, total int64)
	Add(n int64)
	Done()
}

type noMeter struct{}

func (noMeter) Stage(string, int64) {}
func (noMeter) Add(int64)           {}
func (noMeter) Done()               {}

// archiveKinds are the files an archive may hold, by name.
var archiveKinds = map[string]Kind{
	DiscoverKernel: KindKernel, DiscoverInitrd: KindInitrd, HypervisorInitrd: KindInitrd,
	UndionlyKPXE: KindIPXE, IPXEPXE: KindIPXE, IPXEEFI: KindIPXE, SNPOnlyEFI: KindIPXE, SNPArm64EFI: KindIPXE,
}

// Export writes the images registered in catalog directory dir (a
// discovery image is required; the hypervisor image and the iPXE
// binaries the catalog holds come along) to w as an images archive.
// version is recorded in the manifest.
func Export(w io.Writer, cfg Config, version string, m Meter) (Manifest, error) {
	if m == nil {
		m = noMeter{}
	}
	d, ok := ReadBuiltDiscover(cfg.Dir)
	if !ok {
		return Manifest{}, fmt.Errorf("images: %s has no registered discovery image: run corrald images build (or import) first", cfg.Dir)
	}
	cat, err := Open(cfg.WithBuiltDiscover())
	if err != nil {
		return Manifest{}, err
	}
	man := Manifest{Format: ArchiveFormat, Created: time.Now().UTC().Truncate(time.Second), Version: version, KernelRelease: d.Release, DiscoverKey: d.Key}
	if h, ok := ReadBuiltHypervisor(cfg.Dir); ok && h.Release == d.Release {
		man.HypervisorKey = h.Key
	}
	var total int64
	for _, a := range cat.List() {
		if _, ok := archiveKinds[a.Name]; !ok {
			continue
		}
		man.Files = append(man.Files, ArchiveEntry{Name: a.Name, Kind: a.Kind, Size: a.Size, SHA256: a.SHA256})
		total += a.Size
	}
	js, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	js = append(js, '\n')
	msum := sha256.Sum256(js)
	var sums strings.Builder
	fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(msum[:]), ArchiveManifest)
	for _, e := range man.Files {
		fmt.Fprintf(&sums, "%s  %s\n", e.SHA256, e.Name)
	}
	tw := tar.NewWriter(w)
	mtime := man.Created
	small := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	// SHA256SUMS and the manifest first: Import knows what to expect
	// before the large files come.
	if err := small(sumsFile, []byte(sums.String())); err != nil {
		return Manifest{}, fmt.Errorf("images: export: %w", err)
	}
	if err := small(ArchiveManifest, js); err != nil {
		return Manifest{}, fmt.Errorf("images: export: %w", err)
	}
	m.Stage("export images", total)
	for _, e := range man.Files {
		a, _ := cat.Lookup(e.Name)
		if err := exportFile(tw, a, mtime, m); err != nil {
			return Manifest{}, err
		}
	}
	m.Done()
	if err := tw.Close(); err != nil {
		return Manifest{}, fmt.Errorf("images: export: %w", err)
	}
	return man, nil
}

// exportFile copies one catalog file into tw, checking that its bytes are
// still the ones the catalog hashed.
func exportFile(tw *tar.Writer, a Artifact, mtime time.Time, m Meter) error {
	f, err := os.Open(a.Path)
	if err != nil {
		return fmt.Errorf("images: export: %w", err)
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Name: a.Name, Mode: 0o644, Size: a.Size, ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("images: export: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tw, h, meterWriter{m}), io.LimitReader(f, a.Size))
	if err != nil {
		return fmt.Errorf("images: export %s: %w", a.Name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != a.Size || got != a.SHA256 {
		return fmt.Errorf("%w: export %s: changed while exported (%d bytes, sha256 %s; catalog says %d, %s)", ErrMismatch, a.Name, n, got, a.Size, a.SHA256)
	}
	return nil
}

type meterWriter struct{ m Meter }

func (w meterWriter) Write(p []byte) (int, error) { w.m.Add(int64(len(p))); return len(p), nil }

// Imported is what Import registered.
type Imported struct {
	Manifest   Manifest
	Discover   BuiltDiscover
	Hypervisor *BuiltHypervisor
	IPXE       []string
}

// importRecord is ImportRecord's content.
type importRecord struct {
	Source        string    `json:"source,omitempty"`
	Version       string    `json:"corral_version,omitempty"`
	KernelRelease string    `json:"kernel_release"`
	Imported      time.Time `json:"imported"`
}

// Import reads an images archive from r, stages its files beside the
// catalog (cfg.Dir) and checks every one against SHA256SUMS and the
// manifest (names, kinds, sizes, hashes; the manifest's own hash is in
// SHA256SUMS). Only when all of it holds does it register the images as
// `corrald images build` would (RegisterDiscover, RegisterHypervisor) and
// keep the iPXE binaries in ImportedIPXEDir; any error before that leaves
// the catalog as it was. source names the archive in ImportRecord.
// m is told the verify and register stages (the caller meters the read).
func Import(r io.Reader, cfg Config, source string, m Meter) (Imported, error) {
	if m == nil {
		m = noMeter{}
	}
	if cfg.Dir == "" {
		return Imported{}, errors.New("images: Config.Dir is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Imported{}, fmt.Errorf("images: %w", err)
	}
	stage, err := os.MkdirTemp(cfg.Dir, ".import-")
	if err != nil {
		return Imported{}, fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(stage)

	got, sums, manJS, err := readArchive(r, stage)
	if err != nil {
		return Imported{}, err
	}
	m.Stage("verify", 0)
	man, err := verifyArchive(got, sums, manJS)
	if err != nil {
		return Imported{}, err
	}
	m.Done()

	m.Stage("register", 0)
	defer m.Done()
	have := map[string]bool{}
	for _, e := range man.Files {
		have[e.Name] = true
	}
	// iPXE binaries first, into a fresh directory swapped in whole.
	var ipxe []string
	ipxeStage := filepath.Join(stage, "ipxe")
	if err := os.Mkdir(ipxeStage, 0o755); err != nil {
		return Imported{}, fmt.Errorf("images: %w", err)
	}
	for _, e := range man.Files {
		if e.Kind == KindIPXE {
			if err := os.Rename(filepath.Join(stage, e.Name), filepath.Join(ipxeStage, e.Name)); err != nil {
				return Imported{}, fmt.Errorf("images: %w", err)
			}
			ipxe = append(ipxe, e.Name)
		}
	}
	dst := filepath.Join(cfg.Dir, ImportedIPXEDir)
	old := dst + ".old"
	os.RemoveAll(old)
	if err := os.Rename(dst, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Imported{}, fmt.Errorf("images: %w", err)
	}
	if err := os.Rename(ipxeStage, dst); err != nil {
		// Put the previous set back (there is none on a first import);
		// if that fails too, the error says so.
		if rerr := os.Rename(old, dst); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("putting back the previous set: %w", rerr))
		}
		return Imported{}, fmt.Errorf("images: %w", err)
	}
	os.RemoveAll(old)
	out := Imported{Manifest: man, IPXE: ipxe}
	_, out.Discover, err = RegisterDiscover(cfg, filepath.Join(stage, DiscoverKernel), filepath.Join(stage, DiscoverInitrd), man.KernelRelease, man.DiscoverKey)
	if err != nil {
		return Imported{}, err
	}
	if have[HypervisorInitrd] {
		_, h, err := RegisterHypervisor(cfg, filepath.Join(stage, HypervisorInitrd), man.KernelRelease, man.HypervisorKey)
		if err != nil {
			return Imported{}, err
		}
		out.Hypervisor = &h
	}
	rec, _ := json.MarshalIndent(importRecord{Source: source, Version: man.Version, KernelRelease: man.KernelRelease, Imported: time.Now().UTC()}, "", "  ")
	if err := writeAtomic(filepath.Join(cfg.Dir, ImportRecord), func(w io.Writer) error {
		_, err := w.Write(append(rec, '\n'))
		return err
	}); err != nil {
		return Imported{}, err
	}
	return out, nil
}

// staged is one file read from an archive into the staging directory.
type staged struct {
	size   int64
	sha256 string
}

// readArchive copies every archive file into dir, hashing it. It refuses
// names it does not know, anything but regular files, duplicates, more
// than maxArchiveEntries files and sizes past the bounds.
func readArchive(r io.Reader, dir string) (map[string]staged, []byte, []byte, error) {
	tr := tar.NewReader(bufio.NewReaderSize(r, 1<<20))
	got := map[string]staged{}
	var sums, manJS []byte
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %v (a truncated or damaged file?)", ErrArchive, err)
		}
		if n >= maxArchiveEntries {
			return nil, nil, nil, fmt.Errorf("%w: more than %d files", ErrArchive, maxArchiveEntries)
		}
		name := hdr.Name
		if hdr.Typeflag != tar.TypeReg {
			return nil, nil, nil, fmt.Errorf("%w: %q is not a regular file", ErrArchive, name)
		}
		if _, dup := got[name]; dup || (name == sumsFile && sums != nil) || (name == ArchiveManifest && manJS != nil) {
			return nil, nil, nil, fmt.Errorf("%w: %q appears twice", ErrArchive, name)
		}
		switch {
		case name == sumsFile || name == ArchiveManifest:
			if hdr.Size > maxManifestBytes {
				return nil, nil, nil, fmt.Errorf("%w: %s is %d bytes, more than %d", ErrArchive, name, hdr.Size, maxManifestBytes)
			}
			b, err := io.ReadAll(io.LimitReader(tr, maxManifestBytes+1))
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%w: %s: %v", ErrArchive, name, err)
			}
			if name == sumsFile {
				sums = b
			} else {
				manJS = b
			}
		case archiveKinds[name] != "":
			if hdr.Size < 0 || hdr.Size > MaxArtifactBytes {
				return nil, nil, nil, fmt.Errorf("%w: %s: size %d is outside 0..%d", ErrArchive, name, hdr.Size, int64(MaxArtifactBytes))
			}
			f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("images: %w", err)
			}
			h := sha256.New()
			size, err := io.Copy(io.MultiWriter(f, h), tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%w: %s: %v (a truncated or damaged file?)", ErrArchive, name, err)
			}
			got[name] = staged{size: size, sha256: hex.EncodeToString(h.Sum(nil))}
		default:
			return nil, nil, nil, fmt.Errorf("%w: unexpected file %q (an images archive holds %s, %s and images named %s)", ErrArchive, name, sumsFile, ArchiveManifest, strings.Join(archiveNames(), ", "))
		}
	}
	if sums == nil {
		return nil, nil, nil, fmt.Errorf("%w: no %s", ErrArchive, sumsFile)
	}
	if manJS == nil {
		return nil, nil, nil, fmt.Errorf("%w: no %s", ErrArchive, ArchiveManifest)
	}
	return got, sums, manJS, nil
}

func archiveNames() []string {
	var out []string
	for n := range archiveKinds {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// verifyArchive checks the staged files and the manifest against
// SHA256SUMS, and the manifest's entries against the files.
func verifyArchive(got map[string]staged, sums, manJS []byte) (Manifest, error) {
	want := map[string]string{}
	for i, line := range strings.Split(strings.TrimRight(string(sums), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || CheckSHA256(sum) != nil || name == "" {
			return Manifest{}, fmt.Errorf("%w: %s line %d: %q is not \"<sha256>  <name>\"", ErrArchive, sumsFile, i+1, line)
		}
		if _, dup := want[name]; dup {
			return Manifest{}, fmt.Errorf("%w: %s lists %s twice", ErrArchive, sumsFile, name)
		}
		want[name] = sum
	}
	msum := sha256.Sum256(manJS)
	switch w, ok := want[ArchiveManifest]; {
	case !ok:
		return Manifest{}, fmt.Errorf("%w: %s does not list %s", ErrArchive, sumsFile, ArchiveManifest)
	case w != hex.EncodeToString(msum[:]):
		return Manifest{}, fmt.Errorf("%w: %s: sha256 %s, %s says %s: the archive is damaged or was altered; nothing was registered", ErrMismatch, ArchiveManifest, hex.EncodeToString(msum[:]), sumsFile, w)
	}
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w, ok := want[n]
		if !ok {
			return Manifest{}, fmt.Errorf("%w: %s is not listed in %s", ErrArchive, n, sumsFile)
		}
		if got[n].sha256 != w {
			return Manifest{}, fmt.Errorf("%w: %s: sha256 %s, %s says %s: the archive is damaged or was altered; nothing was registered", ErrMismatch, n, got[n].sha256, sumsFile, w)
		}
	}
	for n := range want {
		if _, ok := got[n]; !ok && n != ArchiveManifest {
			return Manifest{}, fmt.Errorf("%w: %s lists %s, which the archive lacks", ErrArchive, sumsFile, n)
		}
	}
	var man Manifest
	dec := json.NewDecoder(bytes.NewReader(manJS))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&man); err != nil {
		return Manifest{}, fmt.Errorf("%w: %s: %v", ErrArchive, ArchiveManifest, err)
	}
	if man.Format != ArchiveFormat {
		return Manifest{}, fmt.Errorf("%w: format %d, this corrald reads format %d: use the corrald of the same release", ErrArchive, man.Format, ArchiveFormat)
	}
	if man.KernelRelease == "" {
		return Manifest{}, fmt.Errorf("%w: %s names no kernel_release", ErrArchive, ArchiveManifest)
	}
	listed := map[string]bool{}
	for _, e := range man.Files {
		g, ok := got[e.Name]
		switch {
		case listed[e.Name]:
			return Manifest{}, fmt.Errorf("%w: %s lists %s twice", ErrArchive, ArchiveManifest, e.Name)
		case !ok:
			return Manifest{}, fmt.Errorf("%w: %s lists %s, which the archive lacks", ErrArchive, ArchiveManifest, e.Name)
		case archiveKinds[e.Name] != e.Kind:
			return Manifest{}, fmt.Errorf("%w: %s: kind %q, want %q", ErrArchive, e.Name, e.Kind, archiveKinds[e.Name])
		case g.size != e.Size || g.sha256 != e.SHA256:
			return Manifest{}, fmt.Errorf("%w: %s: %d bytes, sha256 %s; %s says %d bytes, %s: nothing was registered", ErrMismatch, e.Name, g.size, g.sha256, ArchiveManifest, e.Size, e.SHA256)
		}
		listed[e.Name] = true
	}
	for _, n := range names {
		if !listed[n] {
			return Manifest{}, fmt.Errorf("%w: %s is not in %s", ErrArchive, n, ArchiveManifest)
		}
	}
	if !listed[DiscoverKernel] || !listed[DiscoverInitrd] {
		return Manifest{}, fmt.Errorf("%w: no discovery image (%s and %s)", ErrArchive, DiscoverKernel, DiscoverInitrd)
	}
	if !listed[UndionlyKPXE] && !listed[IPXEEFI] {
		return Manifest{}, fmt.Errorf("%w: no first-stage iPXE binary (%s or %s)", ErrArchive, UndionlyKPXE, IPXEEFI)
	}
	return man, nil
}
