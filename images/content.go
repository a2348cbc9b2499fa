package images

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
)

// ContentDir is the directory, inside a catalog directory, that holds the
// artifacts fetched from peer appliances, each named by its SHA-256 (hex):
// ContentDir/<sha256>. The catalog's own files keep their names beside it.
const ContentDir = "sha256"

// MaxArtifactBytes bounds what Receive accepts, whatever a manifest says
// (the hypervisor initramfs, the largest artifact, is a few hundred MB).
const MaxArtifactBytes = 8 << 30

// sumsFile is the catalog's checksum list, written by Open.
const sumsFile = "SHA256SUMS"

// ErrMismatch means received bytes are not the artifact that was asked for
// (their size or SHA-256 differs).
var ErrMismatch = errors.New("images: content does not match")

// CheckSHA256 returns an error unless s is a SHA-256 in lower-case hex.
func CheckSHA256(s string) error {
	if len(s) != 2*sha256.Size {
		return fmt.Errorf("images: %q is not a SHA-256 (64 lower-case hex digits)", s)
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("images: %q is not a SHA-256 (64 lower-case hex digits)", s)
		}
	}
	return nil
}

// KindOf is the kind of the artifact a boot server knows by name ("" for a
// name it does not know).
func KindOf(name string) Kind {
	switch name {
	case UndionlyKPXE, IPXEPXE, IPXEEFI, SNPOnlyEFI, SNPArm64EFI:
		return KindIPXE
	case ShimX64EFI, GrubX64EFI, GRUBARM64EFI:
		return KindLoader
	case DiscoverKernel, ARM64Kernel:
		return KindKernel
	case DiscoverInitrd, HypervisorInitrd, ARM64Initrd:
		return KindInitrd
	}
	return ""
}

// ReadSums returns the artifacts of the catalog in dir as its last Open
// installed them (its SHA256SUMS), each with its path, size and kind; a
// file listed but gone is left out. A directory whose catalog was never
// opened has none.
func ReadSums(dir string) ([]Artifact, error) {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	defer f.Close()
	var out []Artifact
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || CheckSHA256(sum) != nil || name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			continue
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		out = append(out, Artifact{Name: name, Kind: KindOf(name), Path: p, Size: st.Size(), SHA256: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("images: %s: %w", f.Name(), err)
	}
	return out, nil
}

// contentPath is where dir's content store keeps sum.
func contentPath(dir, sum string) string { return filepath.Join(dir, ContentDir, sum) }

// Held returns the artifact whose content is sum that the catalog
// directory dir holds: one fetched from a peer (ContentDir/sum, whose Name
// is sum) or a catalog file its SHA256SUMS lists. It returns an error
// wrapping ErrNotFound when dir holds none, and an error for a malformed
// sum. The file's content is as it was written; callers that serve it
// check the hash as they read.
func Held(dir, sum string) (Artifact, error) {
	if err := CheckSHA256(sum); err != nil {
		return Artifact{}, err
	}
	if st, err := os.Stat(contentPath(dir, sum)); err == nil && st.Mode().IsRegular() {
		return Artifact{Name: sum, Path: contentPath(dir, sum), Size: st.Size(), SHA256: sum}, nil
	}
	arts, err := ReadSums(dir)
	if err != nil {
		return Artifact{}, err
	}
	for _, a := range arts {
		if a.SHA256 == sum {
			return a, nil
		}
	}
	return Artifact{}, fmt.Errorf("%w: no artifact with sha256 %s in %s", ErrNotFound, sum, dir)
}

// Receive stores the artifact want (its Size and SHA256) read from r in
// dir's content store: the bytes go to a temporary file, hashed as they
// arrive and never more than want.Size of them (plus one, to tell a longer
// stream), and only a file of exactly that size and hash is renamed into
// place, as ContentDir/<sha256>. A stream that is short, long, of another
// hash or that fails leaves nothing behind; the error wraps ErrMismatch
// for the first three and says how many bytes came. It returns the stored
// artifact, whose Name is want.Name. Concurrent calls for the same
// content are safe (the last rename wins, with the same bytes).
func Receive(dir string, want Artifact, r io.Reader) (Artifact, error) {
	if err := CheckSHA256(want.SHA256); err != nil {
		return Artifact{}, err
	}
	if want.Size < 0 || want.Size > MaxArtifactBytes {
		return Artifact{}, fmt.Errorf("images: %s: size %d is outside 0..%d", want.Name, want.Size, int64(MaxArtifactBytes))
	}
	cdir := filepath.Join(dir, ContentDir)
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		return Artifact{}, fmt.Errorf("images: %w", err)
	}
	dst := contentPath(dir, want.SHA256)
	tmp, err := renameio.NewPendingFile(dst, renameio.WithTempDir(cdir), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return Artifact{}, fmt.Errorf("images: %w", err)
	}
	defer tmp.Cleanup() // after the rename, a no-op
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, want.Size+1))
	if err != nil {
		return Artifact{}, fmt.Errorf("images: %s: receiving failed after %d of %d bytes: %w", want.Name, n, want.Size, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	switch {
	case n > want.Size:
		err = fmt.Errorf("%w: %s: more than the %d bytes announced", ErrMismatch, want.Name, want.Size)
	case n < want.Size:
		err = fmt.Errorf("%w: %s: truncated: %d of %d bytes", ErrMismatch, want.Name, n, want.Size)
	case got != want.SHA256:
		err = fmt.Errorf("%w: %s: sha256 %s, want %s", ErrMismatch, want.Name, got, want.SHA256)
	}
	if err != nil {
		return Artifact{}, err
	}
	if err := tmp.CloseAtomicallyReplace(); err != nil {
		return Artifact{}, fmt.Errorf("images: %w", err)
	}
	return Artifact{Name: want.Name, Kind: want.Kind, Path: dst, Size: n, SHA256: got}, nil
}

// WithFleet returns c with each boot profile file (Kernel, Initrd,
// HypervisorInitrd) that c leaves unset and fleet names (by DiscoverKernel,
// DiscoverInitrd, HypervisorInitrd) set to the copy in c.Dir's content
// store, when it holds one: an appliance then boots what the fleet's
// shared catalog manifest says, fetched from a peer. Call it before
// WithBuiltDiscover, which leaves set files alone; explicit files (flags)
// win over both.
func (c Config) WithFleet(fleet []Artifact) Config {
	if c.Dir == "" {
		return c
	}
	for _, a := range fleet {
		var field *string
		switch a.Name {
		case DiscoverKernel:
			field = &c.Kernel
		case DiscoverInitrd:
			field = &c.Initrd
		case HypervisorInitrd:
			field = &c.HypervisorInitrd
		default:
			continue
		}
		if *field != "" || CheckSHA256(a.SHA256) != nil {
			continue
		}
		p := contentPath(c.Dir, a.SHA256)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Size() == a.Size {
			*field = p
		}
	}
	return c
}
