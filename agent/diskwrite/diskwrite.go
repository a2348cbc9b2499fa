// Package diskwrite writes an operating-system image to a disk from its
// block map (internal/diskmap), in the discovery agent: pure Go, Linux.
// Write checks the map and the device's size before touching the device,
// then, extent by extent, fetches the raw bytes (a Range GET against the
// appliance's raw view of the image: qcow2 is converted there, never
// here), hashes them as they stream, writes them at their offset, and
// refuses an extent whose hash differs, naming it. The ranges between
// extents are made to read zero without writing them byte by byte:
// BLKZEROOUT on a block device (the kernel uses write-zeroes where the
// device has it), BLKDISCARD only where the queue says discarded blocks
// read zero, a punched hole in a regular file, and written zeros only as
// the last resort. At the end it syncs, drops the device's cached pages
// and reads a few extents back.
//
// It imports nothing of Corral's but the map format; it never imports
// the appliance's builder (images/blockmap).
package diskwrite

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/corralhq/corral/internal/diskmap"
)

// Errors Write wraps.
var (
	// ErrTooSmall: the map's virtual size exceeds the device's size.
	ErrTooSmall = errors.New("device smaller than the image")
	// ErrHashMismatch: an extent's bytes do not hash to the map's value.
	ErrHashMismatch = errors.New("extent hash mismatch")
	// ErrReadBack: a sampled extent read back from the device differs.
	ErrReadBack = errors.New("read-back check failed")
)

// ExtentError names the extent a write failed on.
type ExtentError struct {
	Index  int
	Extent diskmap.Extent
	Err    error
}

func (e *ExtentError) Error() string {
	return fmt.Sprintf("extent %d %v: %v", e.Index, e.Extent, e.Err)
}

func (e *ExtentError) Unwrap() error { return e.Err }

// Fetch returns a reader of the raw image's bytes [off, off+length); the
// caller closes it. A reader that ends early or fails is retried.
type Fetch func(ctx context.Context, off, length int64) (io.ReadCloser, error)

// Config says what to write where.
type Config struct {
	// Device is the path of the block device (or regular file) to write.
	Device string
	// Map is the image's block map, already checked against the digest
	// the install plan carried (diskmap.Parse). Write validates it again.
	Map *diskmap.Map
	// Fetch reads the raw image.
	Fetch Fetch
	// Progress, if set, is called after each extent and each zeroed
	// range with the bytes of the virtual disk done so far and its size.
	Progress func(done, total int64)
	// Attempts per extent (fetch failures, short reads and hash
	// mismatches); 3 when zero.
	Attempts int
	// Backoff before the second attempt, doubling after; 500ms when zero.
	Backoff time.Duration
	// Samples is how many extents are read back at the end (the first,
	// the last and some between); 4 when zero, none when negative.
	Samples int
	// Log receives one line per retry and the final figures; discarded
	// when nil.
	Log *slog.Logger
}

// bufSize is the size of each write: large, and a multiple of any
// logical block size.
const bufSize = 4 << 20

// Write writes cfg.Map's image to cfg.Device. It refuses, before opening
// the device for writing, a malformed map or a device smaller than the
// image. It returns ctx's error when ctx ends (the device then holds a
// partial image). Errors naming an extent are *ExtentError.
func Write(ctx context.Context, cfg Config) error {
	if err := cfg.Map.Validate(); err != nil {
		return fmt.Errorf("write %s: %w", cfg.Device, err)
	}
	if cfg.Fetch == nil {
		return fmt.Errorf("write %s: no Fetch", cfg.Device)
	}
	cfg.Attempts = max(cfg.Attempts, 0)
	if cfg.Attempts == 0 {
		cfg.Attempts = 3
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 500 * time.Millisecond
	}
	if cfg.Samples == 0 {
		cfg.Samples = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	f, err := os.OpenFile(cfg.Device, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("write %s: %w", cfg.Device, err)
	}
	defer f.Close()
	dev, err := openTarget(f)
	if err != nil {
		return fmt.Errorf("write %s: %w", cfg.Device, err)
	}
	m := cfg.Map
	if m.Size > dev.size {
		return fmt.Errorf("write %s: %w: image %d bytes, device %d bytes", cfg.Device, ErrTooSmall, m.Size, dev.size)
	}
	w := &writer{cfg: cfg, f: f, dev: dev, buf: make([]byte, bufSize), h: sha256.New()}
	start := time.Now()
	var pos, done int64
	progress := func(n int64) {
		done += n
		if cfg.Progress != nil {
			cfg.Progress(done, m.Size)
		}
	}
	for i, e := range m.Extents {
		if e.Offset > pos {
			if err := w.zero(pos, e.Offset-pos); err != nil {
				return fmt.Errorf("write %s: zero [%d, %d): %w", cfg.Device, pos, e.Offset, err)
			}
			progress(e.Offset - pos)
		}
		if err := w.extent(ctx, i, e); err != nil {
			return fmt.Errorf("write %s: %w", cfg.Device, err)
		}
		progress(e.Length)
		pos = e.End()
	}
	if m.Size > pos {
		if err := w.zero(pos, m.Size-pos); err != nil {
			return fmt.Errorf("write %s: zero [%d, %d): %w", cfg.Device, pos, m.Size, err)
		}
		progress(m.Size - pos)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", cfg.Device, err)
	}
	if err := w.readBack(ctx); err != nil {
		return fmt.Errorf("write %s: %w", cfg.Device, err)
	}
	cfg.Log.Info("image written", "device", cfg.Device, "size", m.Size, "data_bytes", m.DataBytes(),
		"extents", len(m.Extents), "zeroed_by", w.zeroedBy, "seconds", time.Since(start).Seconds())
	return nil
}

type writer struct {
	cfg      Config
	f        *os.File
	dev      target
	buf      []byte
	h        hash.Hash
	zeroedBy string // how the last gap was zeroed, for the log
}

// extent fetches, hashes and writes one extent, with retries.
func (w *writer) extent(ctx context.Context, i int, e diskmap.Extent) error {
	backoff := w.cfg.Backoff
	var err error
	for attempt := 1; attempt <= w.cfg.Attempts; attempt++ {
		if attempt > 1 {
			w.cfg.Log.Warn("extent retried", "device", w.cfg.Device, "extent", i, "offset", e.Offset, "attempt", attempt, "err", err)
			select {
			case <-ctx.Done():
				return &ExtentError{Index: i, Extent: e, Err: ctx.Err()}
			case <-time.After(backoff):
			}
			backoff *= 2
		}
		err = w.tryExtent(ctx, e)
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return &ExtentError{Index: i, Extent: e, Err: err}
	}
	return nil
}

func (w *writer) tryExtent(ctx context.Context, e diskmap.Extent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rc, err := w.cfg.Fetch(ctx, e.Offset, e.Length)
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	defer rc.Close()
	w.h.Reset()
	off := e.Offset
	for left := e.Length; left > 0; {
		p := w.buf[:min(int64(len(w.buf)), left)]
		if _, err := io.ReadFull(rc, p); err != nil {
			return fmt.Errorf("fetch at %d: %w", off, err)
		}
		w.h.Write(p)
		if _, err := w.f.WriteAt(p, off); err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
		off += int64(len(p))
		left -= int64(len(p))
	}
	if got := hex.EncodeToString(w.h.Sum(nil)); got != e.SHA256 {
		return fmt.Errorf("%w: got %s", ErrHashMismatch, got)
	}
	return nil
}

// zero makes [off, off+n) read zero.
func (w *writer) zero(off, n int64) error {
	how, err := w.dev.zero(w.f, off, n)
	if err != nil {
		return err
	}
	w.zeroedBy = how
	return nil
}

// writeZeros writes zeros over [off, off+n) with large writes.
func writeZeros(f *os.File, off, n int64) error {
	z := make([]byte, min(n, bufSize))
	for n > 0 {
		p := z[:min(int64(len(z)), n)]
		if _, err := f.WriteAt(p, off); err != nil {
			return err
		}
		off += int64(len(p))
		n -= int64(len(p))
	}
	return nil
}

// readBack drops the device's cached pages and checks a few extents'
// hashes against what the device now holds.
func (w *writer) readBack(ctx context.Context) error {
	ext := w.cfg.Map.Extents
	if w.cfg.Samples < 0 || len(ext) == 0 {
		return nil
	}
	w.dev.dropCache(w.f)
	n := min(w.cfg.Samples, len(ext))
	seen := map[int]bool{}
	for k := range n {
		i := 0
		if n > 1 {
			i = k * (len(ext) - 1) / (n - 1) // first, last, evenly between
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		if err := ctx.Err(); err != nil {
			return err
		}
		e := ext[i]
		w.h.Reset()
		if _, err := io.Copy(w.h, io.NewSectionReader(w.f, e.Offset, e.Length)); err != nil {
			return &ExtentError{Index: i, Extent: e, Err: fmt.Errorf("%w: read: %v", ErrReadBack, err)}
		}
		if got := hex.EncodeToString(w.h.Sum(nil)); got != e.SHA256 {
			return &ExtentError{Index: i, Extent: e, Err: fmt.Errorf("%w: device holds sha256 %s", ErrReadBack, got)}
		}
	}
	return nil
}
