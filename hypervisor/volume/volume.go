// Package volume owns the node's qcow2 volumes: one file per volume under a
// directory, created with qemu-img (empty, or as a copy-on-write overlay of
// another volume through an absolute backing-file path), fetched over
// http(s) into a temporary file with a size limit, a timeout, a redirect
// policy and a SHA-256 check before an atomic, no-clobber link into place,
// resized, inspected with `qemu-img info --output=json` and deleted.
//
// Every volume is qcow2, except fetched ISO9660 images, which stay raw
// (format "raw" means "attach me as a read-only CD-ROM").
//
// Formats are never guessed by QEMU. A fetched file is hostile until
// proven otherwise (the source is an operator's URL, but the bytes come
// from whoever answers it), and letting qemu-img or QEMU probe a format
// lets a file choose to be read as a format that opens other files.
// Corral decides between the only two formats it accepts by itself
// (sniffFormat: the qcow2 magic, else raw) and passes that format
// explicitly to every qemu-img call (-f, -F, -O) and every QEMU
// -blockdev (hypervisor/vm). On a fetch:
//
//   - A declared format (FetchRequest.Format) must match the file: a raw
//     file declared qcow2, or a file declared raw that starts with the
//     qcow2 magic, is refused.
//   - Undeclared (every FetchVolume through HypervisorService today: its
//     request has no format field), the sniffed format is used and from
//     then on declared: raw is accepted as raw — read with -f raw, so
//     no header in it is ever interpreted — and a qcow2 is checked.
//   - A qcow2 is accepted only self-contained: its header is parsed in Go
//     before qemu-img opens it, and a backing file (any name, json:
//     pseudo-protocols included), an external data file, encryption,
//     unknown incompatible features or a malformed header is refused
//     (ErrImageRefused, class InvalidArgument, naming the reason); the
//     answer of `qemu-img info -f qcow2` is checked again for the same.
//   - Redirects are followed only to http or https, never from https down
//     to http, and at most Config.MaxRedirects times (ErrRedirect); a body
//     shorter than its Content-Length is ErrFetch.
//
// A raw ISO is kept; any other raw image is converted to qcow2 with -f
// raw. Nothing is ever half-created: work happens on a hidden temporary
// file that is linked to the final name only when complete and synced
// (file, then directory), a refused download removes its temporary file,
// stale temporary files are removed by New, and a delete syncs the
// directory before it returns.
//
// It imports only the standard library, internal/apierr and
// hypervisor/internal.
package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/hypervisor/internal/durable"
	"github.com/corralhq/corral/hypervisor/internal/namelock"
	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/internal/apierr"
)

// Volume describes one volume file.
type Volume struct {
	Name        string
	Path        string
	SizeBytes   uint64 // virtual size
	ActualBytes uint64 // bytes allocated on the host
	Format      string
	BackingFile string
}

// Config configures a Store.
type Config struct {
	// Dir holds the volume files; it is created with mode 0700.
	Dir string
	// QemuImg is the qemu-img binary (default "qemu-img" on PATH).
	QemuImg string
	// Logger receives one line per change; nil discards.
	Logger *slog.Logger
	// MaxFetchBytes caps a download when the request gives no lower cap
	// (default 64 GiB).
	MaxFetchBytes uint64
	// FetchTimeout bounds a download when the request gives none
	// (default 30 min).
	FetchTimeout time.Duration
	// CommandTimeout bounds each qemu-img call (default 2 min).
	CommandTimeout time.Duration
	// MaxRedirects caps the HTTP redirects one fetch follows (default 5;
	// negative: none). A refused redirect is logged and fails the fetch
	// with ErrRedirect.
	MaxRedirects int
	// Transport, when set, replaces the download transport (a clone of
	// net/http's default); tests use it to trust a test server.
	Transport http.RoundTripper
}

// DefaultMaxRedirects is Config.MaxRedirects' default.
const DefaultMaxRedirects = 5

// Store manages the volumes in one directory. It is safe for concurrent
// use; operations on one name are serialised by an in-process lock (the
// node agent is the only writer of its data directory).
type Store struct {
	cfg  Config
	log  *slog.Logger
	http *http.Client

	locks namelock.Table
}

const tmpPrefix = ".tmp-"

// New validates cfg, creates the directory and removes temporary files a
// previous process left behind.
func New(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, apierr.Invalidf("volume: Dir is required")
	}
	if cfg.QemuImg == "" {
		cfg.QemuImg = "qemu-img"
	}
	if cfg.MaxFetchBytes == 0 {
		cfg.MaxFetchBytes = 64 << 30
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 30 * time.Minute
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 2 * time.Minute
	}
	switch {
	case cfg.MaxRedirects == 0:
		cfg.MaxRedirects = DefaultMaxRedirects
	case cfg.MaxRedirects < 0:
		cfg.MaxRedirects = 0
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	cfg.Dir = abs
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volume: create %s: %w", cfg.Dir, err)
	}
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			log.Info("removing stale temporary volume file", "path", filepath.Join(cfg.Dir, e.Name()))
			_ = os.Remove(filepath.Join(cfg.Dir, e.Name()))
		}
	}
	return &Store{cfg: cfg, log: log, http: newHTTPClient(cfg.Transport, cfg.MaxRedirects, log)}, nil
}

// Dir returns the absolute directory of the store.
func (s *Store) Dir() string { return s.cfg.Dir }

// Path returns the file path of volume name (which need not exist).
func (s *Store) Path(name string) (string, error) {
	if err := safename.Check("volume", name); err != nil {
		return "", err
	}
	return filepath.Join(s.cfg.Dir, name), nil
}

// Create makes an empty qcow2 volume of size bytes. It returns apierr.ErrAlreadyExists
// if the name is taken and apierr.ErrInvalid for a bad name or a zero size.
func (s *Store) Create(ctx context.Context, name string, size uint64) (Volume, error) {
	path, err := s.Path(name)
	if err != nil {
		return Volume{}, err
	}
	if size == 0 {
		return Volume{}, apierr.Invalidf("volume %q: size must be > 0", name)
	}
	defer s.locks.Lock(name)()
	if err := s.mustNotExist(name, path); err != nil {
		return Volume{}, err
	}
	return s.build(ctx, name, path, func(tmp string) error {
		return s.qemuImg(ctx, "create", "-q", "-f", "qcow2", tmp, strconv.FormatUint(size, 10))
	})
}

// CreateFrom makes volume name as a copy-on-write qcow2 overlay of volume
// backing (no data is copied, so the time does not depend on the backing
// size). size 0 keeps the backing volume's virtual size; a smaller size
// than the backing volume's is apierr.ErrInvalid. The backing volume must exist
// (apierr.ErrNotFound) and is then in use until the overlay is deleted.
func (s *Store) CreateFrom(ctx context.Context, name, backing string, size uint64) (Volume, error) {
	path, err := s.Path(name)
	if err != nil {
		return Volume{}, err
	}
	if name == backing {
		return Volume{}, apierr.Invalidf("volume %q cannot back itself", name)
	}
	base, err := s.Get(ctx, backing)
	if err != nil {
		return Volume{}, err
	}
	if size != 0 && size < base.SizeBytes {
		return Volume{}, apierr.Invalidf("volume %q: size %d is below backing volume %q's %d bytes", name, size, backing, base.SizeBytes)
	}
	defer s.locks.Lock(name)()
	if err := s.mustNotExist(name, path); err != nil {
		return Volume{}, err
	}
	return s.build(ctx, name, path, func(tmp string) error {
		args := []string{"create", "-q", "-f", "qcow2", "-b", base.Path, "-F", base.Format, tmp}
		if size != 0 {
			args = append(args, strconv.FormatUint(size, 10))
		}
		return s.qemuImg(ctx, args...)
	})
}

// Resize grows volume name to size bytes. Shrinking is apierr.ErrInvalid (it would
// destroy data); a volume open in a running VM fails with qemu-img's lock
// error.
func (s *Store) Resize(ctx context.Context, name string, size uint64) (Volume, error) {
	path, err := s.Path(name)
	if err != nil {
		return Volume{}, err
	}
	defer s.locks.Lock(name)()
	v, err := s.Get(ctx, name)
	if err != nil {
		return Volume{}, err
	}
	if size < v.SizeBytes {
		return Volume{}, apierr.Invalidf("volume %q: shrinking from %d to %d bytes is refused", name, v.SizeBytes, size)
	}
	if size == v.SizeBytes {
		return v, nil
	}
	if err := s.qemuImg(ctx, "resize", "-q", "-f", v.Format, path, strconv.FormatUint(size, 10)); err != nil {
		return Volume{}, fmt.Errorf("volume %q: resize: %w", name, err)
	}
	s.log.Info("volume resized", "volume", name, "size_bytes", size)
	return s.Get(ctx, name)
}

// Get inspects volume name with qemu-img info (shared lock, so it works on
// volumes a running VM holds open).
func (s *Store) Get(ctx context.Context, name string) (Volume, error) {
	path, err := s.Path(name)
	if err != nil {
		return Volume{}, err
	}
	if _, err := os.Lstat(path); err != nil {
		if os.IsNotExist(err) {
			return Volume{}, apierr.NotFoundf("volume %q", name)
		}
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	v, err := s.info(ctx, path)
	if err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	v.Name = name
	return v, nil
}

// List returns every volume, sorted by name.
func (s *Store) List(ctx context.Context) ([]Volume, error) {
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	out := make([]Volume, 0, len(names))
	for _, n := range names {
		v, err := s.Get(ctx, n)
		if err != nil {
			if errors.Is(err, apierr.ErrNotFound) { // deleted meanwhile
				continue
			}
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Delete removes volume name. It returns apierr.ErrNotFound if it does not exist
// and apierr.ErrPrecondition if another volume uses it as its backing file. Callers that
// know about VMs must check those themselves.
func (s *Store) Delete(ctx context.Context, name string) error {
	path, err := s.Path(name)
	if err != nil {
		return err
	}
	defer s.locks.Lock(name)()
	if _, err := os.Lstat(path); err != nil {
		if os.IsNotExist(err) {
			return apierr.NotFoundf("volume %q", name)
		}
		return err
	}
	users, err := s.BackedBy(name)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return apierr.Preconditionf("volume %q is the backing file of %s", name, strings.Join(users, ", "))
	}
	// Durable: a volume the appliance was told is gone must not come
	// back after a power cut (its storage is counted as free).
	if err := durable.Remove(path); err != nil {
		return fmt.Errorf("volume %q: %w", name, err)
	}
	s.log.Info("volume deleted", "volume", name)
	return nil
}

// BackedBy returns the volumes whose qcow2 backing file is volume name,
// read from the qcow2 headers (no qemu-img call per volume).
func (s *Store) BackedBy(name string) ([]string, error) {
	target := filepath.Join(s.cfg.Dir, name)
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	var users []string
	for _, n := range names {
		if n == name {
			continue
		}
		b, err := backingFile(filepath.Join(s.cfg.Dir, n))
		if err != nil || b == "" {
			continue
		}
		if !filepath.IsAbs(b) {
			b = filepath.Join(s.cfg.Dir, b)
		}
		if filepath.Clean(b) == target {
			users = append(users, n)
		}
	}
	return users, nil
}

func (s *Store) names() ([]string, error) {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.Type().IsRegular() || safename.Check("volume", e.Name()) != nil {
			continue
		}
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names, nil
}

func (s *Store) mustNotExist(name, path string) error {
	if _, err := os.Lstat(path); err == nil {
		return apierr.Existsf("volume %q", name)
	} else if !os.IsNotExist(err) {
		return fmt.Errorf("volume %q: %w", name, err)
	}
	return nil
}

// build runs fill on a fresh temporary path and links the result to path
// without clobbering; on any error the temporary file is removed.
func (s *Store) build(ctx context.Context, name, path string, fill func(tmp string) error) (Volume, error) {
	tmp, err := s.tempPath(name)
	if err != nil {
		return Volume{}, err
	}
	defer os.Remove(tmp)
	if err := fill(tmp); err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	// Durable before it is published: the node may lose power right after.
	if err := durable.SyncFile(tmp); err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if os.IsExist(err) {
			return Volume{}, apierr.Existsf("volume %q", name)
		}
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	os.Remove(tmp)
	if err := durable.SyncDir(s.cfg.Dir); err != nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	v, err := s.Get(ctx, name)
	if err != nil {
		return Volume{}, err
	}
	s.log.Info("volume created", "volume", name, "size_bytes", v.SizeBytes, "backing_file", v.BackingFile)
	return v, nil
}

// tempPath reserves a unique hidden name in the store directory (same
// filesystem as the final file, so the link is atomic).
func (s *Store) tempPath(name string) (string, error) {
	f, err := os.CreateTemp(s.cfg.Dir, tmpPrefix+name+"-*")
	if err != nil {
		return "", fmt.Errorf("volume %q: %w", name, err)
	}
	p := f.Name()
	f.Close()
	// qemu-img create refuses nothing and overwrites: the reserved name is
	// ours alone.
	return p, nil
}

// imgInfo is the part of `qemu-img info --output=json` Store reads.
type imgInfo struct {
	VirtualSize     uint64 `json:"virtual-size"`
	ActualSize      uint64 `json:"actual-size"`
	Format          string `json:"format"`
	BackingFilename string `json:"backing-filename"`
	FullBacking     string `json:"full-backing-filename"`
	Encrypted       bool   `json:"encrypted"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// info inspects a volume file: its format decided by sniffFormat, then
// qemu-img info with that format given.
func (s *Store) info(ctx context.Context, path string) (Volume, error) {
	format, err := sniffFormat(path)
	if err != nil {
		return Volume{}, err
	}
	ii, err := s.infoAs(ctx, path, format)
	return ii.v, err
}

// inspected is what infoAs found: the Volume and what checkImage
// double-checks.
type inspected struct {
	v         Volume
	format    string
	backing   string
	dataFile  string
	encrypted bool
}

// infoAs runs qemu-img info with the format given (-f): qemu-img never
// probes, and with a shared lock (-U) it works on volumes a running VM
// holds open. It does not open backing files.
func (s *Store) infoAs(ctx context.Context, path, format string) (inspected, error) {
	out, err := s.qemuImgOut(ctx, "info", "-U", "--output=json", "-f", format, path)
	if err != nil {
		return inspected{}, err
	}
	var ii imgInfo
	if err := json.Unmarshal(out, &ii); err != nil {
		return inspected{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	b := ii.FullBacking
	if b == "" {
		b = ii.BackingFilename
	}
	return inspected{
		v:      Volume{Path: path, SizeBytes: ii.VirtualSize, ActualBytes: ii.ActualSize, Format: ii.Format, BackingFile: b},
		format: ii.Format, backing: b, dataFile: ii.FormatSpecific.Data.DataFile, encrypted: ii.Encrypted,
	}, nil
}

func (s *Store) qemuImg(ctx context.Context, args ...string) error {
	_, err := s.qemuImgOut(ctx, args...)
	return err
}

func (s *Store) qemuImgOut(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.cfg.QemuImg, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			return nil, fmt.Errorf("qemu-img %s: %w (%s)", args[0], ctx.Err(), msg)
		}
		return nil, fmt.Errorf("qemu-img %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// backingFile reads the backing file name from a qcow2 header; "" for a
// file that is not qcow2 or has no backing file.
func backingFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// The backing file is read before the header extensions, so a
	// malformed extension does not hide it (and the volume it names stays
	// protected from deletion).
	h, _ := parseQcow2Header(f)
	if !h.HasBacking {
		return "", nil
	}
	return h.BackingFile, nil
}
