package blockmap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/corralhq/corral/internal/diskmap"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"
	"golang.org/x/sys/unix"
)

// Format is an image's declared on-disk format.
type Format string

// The formats Open reads.
const (
	Raw   Format = "raw"
	Qcow2 Format = "qcow2"
)

// BlockSize is the granularity of zero detection: a block holding one
// non-zero byte is data. Extents start on a multiple of it.
const BlockSize = 1 << 20

// ErrFormat is wrapped when a file is not a readable image of its
// declared format (or uses a feature refused here: a backing file,
// encryption).
var ErrFormat = errors.New("image not readable as its declared format")

// Image is the raw virtual view of an image file. ReadAt may be called
// from several goroutines at once (go-qcow2reader guards its table cache).
type Image struct {
	f      *os.File
	format Format
	size   int64
	ra     io.ReaderAt
	q      *qcow2.Qcow2
}

// Open opens the image at path as format. The caller closes it.
func Open(path string, format Format) (*Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	im, err := open(f, format)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("image %s: %w", path, err)
	}
	return im, nil
}

// refuseBacking reads the two header fields that name a backing file
// (magic at 0, backing_file_offset at 8, big-endian) and refuses one
// before go-qcow2reader would open it: a stored image stands alone.
func refuseBacking(f *os.File) error {
	var h [16]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return fmt.Errorf("%w: qcow2 header: %v", ErrFormat, err)
	}
	if string(h[:4]) != "QFI\xfb" {
		return fmt.Errorf("%w: no qcow2 magic", ErrFormat)
	}
	if binary.BigEndian.Uint64(h[8:]) != 0 {
		return fmt.Errorf("%w: qcow2 with a backing file: flatten it first (qemu-img convert)", ErrFormat)
	}
	return nil
}

// nameless hides the *os.File's Name from go-qcow2reader, which would
// otherwise open a backing file named in the image, relative to it.
type nameless struct{ io.ReaderAt }

func open(f *os.File, format Format) (*Image, error) {
	switch format {
	case Raw:
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%w: not a regular file", ErrFormat)
		}
		return &Image{f: f, format: Raw, size: st.Size(), ra: f}, nil
	case Qcow2:
		if err := refuseBacking(f); err != nil {
			return nil, err
		}
		q, err := qcow2.Open(nameless{f}, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: qcow2: %v", ErrFormat, err)
		}
		switch {
		case q.Readable() != nil:
			return nil, fmt.Errorf("%w: qcow2: %v", ErrFormat, q.Readable())
		case q.Size() <= 0:
			return nil, fmt.Errorf("%w: qcow2 virtual size %d", ErrFormat, q.Size())
		}
		return &Image{f: f, format: Qcow2, size: q.Size(), ra: q, q: q}, nil
	default:
		return nil, fmt.Errorf("%w: unknown format %q (raw or qcow2)", ErrFormat, format)
	}
}

// Size is the virtual disk size in bytes.
func (im *Image) Size() int64 { return im.size }

// Format is the format the image was opened as.
func (im *Image) Format() Format { return im.format }

// ReadAt reads the virtual disk: qcow2 clusters are resolved (and
// decompressed) here, unallocated ranges read as zero. It returns io.EOF
// at or past Size, as io.ReaderAt says.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at %d: negative offset", off)
	}
	if off >= im.size {
		return 0, io.EOF
	}
	want := len(p)
	if rest := im.size - off; int64(want) > rest {
		p = p[:rest]
	}
	n, err := im.ra.ReadAt(p, off)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	if err == nil && n < want {
		err = io.EOF
	}
	return n, err
}

// Close closes the file.
func (im *Image) Close() error { return im.f.Close() }

// Map reads the image and returns its block map (not yet marshalled:
// diskmap.Map.Marshal gives the encoding and its digest). It reads every
// candidate data block once; it refuses an image whose map would exceed
// diskmap.MaxExtents. It stops with ctx's error when ctx ends.
func (im *Image) Map(ctx context.Context) (*diskmap.Map, error) {
	m := &diskmap.Map{Version: diskmap.Version, Size: im.size, BlockSize: BlockSize, Extents: []diskmap.Extent{}}
	var (
		cur  diskmap.Extent
		hash = sha256.New()
		buf  = make([]byte, BlockSize)
	)
	flush := func() error {
		if cur.Length == 0 {
			return nil
		}
		if len(m.Extents) == diskmap.MaxExtents {
			return fmt.Errorf("%w: more than %d data extents (the image is too fragmented for a block map)", diskmap.ErrMalformed, diskmap.MaxExtents)
		}
		cur.SHA256 = hex.EncodeToString(hash.Sum(nil))
		m.Extents = append(m.Extents, cur)
		cur = diskmap.Extent{}
		hash.Reset()
		return nil
	}
	err := im.candidates(func(start, end int64) error {
		// Whole blocks covering [start, end).
		for b := start / BlockSize * BlockSize; b < end; b += BlockSize {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(BlockSize, im.size-b)
			p := buf[:n]
			if _, err := im.ReadAt(p, b); err != nil {
				return fmt.Errorf("read at %d: %w", b, err)
			}
			if allZero(p) {
				if err := flush(); err != nil {
					return err
				}
				continue
			}
			if cur.Length > 0 && (cur.End() != b || cur.Length+n > diskmap.MaxExtentLength) {
				if err := flush(); err != nil {
					return err
				}
			}
			if cur.Length == 0 {
				cur.Offset = b
			}
			cur.Length += n
			hash.Write(p)
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return nil, fmt.Errorf("block map: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("block map: %w", err)
	}
	return m, nil
}

// candidates calls fn with ranges [start, end), ascending and disjoint
// after rounding out to BlockSize, that may hold data; the rest of the
// virtual disk reads as zero for certain.
func (im *Image) candidates(fn func(start, end int64) error) error {
	var ranges func(yield func(start, end int64) error) error
	if im.format == Qcow2 {
		ranges = im.qcow2Data
	} else {
		ranges = im.rawData
	}
	// Coalesce ranges that touch the same block so a block is read once.
	var cs, ce int64 = -1, -1
	err := ranges(func(start, end int64) error {
		bs, be := start/BlockSize*BlockSize, min(roundUp(end, BlockSize), im.size)
		if cs >= 0 && bs <= ce {
			ce = max(ce, be)
			return nil
		}
		if cs >= 0 {
			if err := fn(cs, ce); err != nil {
				return err
			}
		}
		cs, ce = bs, be
		return nil
	})
	if err != nil {
		return err
	}
	if cs >= 0 {
		return fn(cs, ce)
	}
	return nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// rawData yields the file's data ranges by SEEK_DATA/SEEK_HOLE; where the
// file system does not say, the whole file.
func (im *Image) rawData(yield func(start, end int64) error) error {
	fd := int(im.f.Fd())
	var off int64
	for off < im.size {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole up to the end
		}
		if err != nil {
			if off == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
				return yield(0, im.size)
			}
			return fmt.Errorf("seek data from %d: %w", off, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole from %d: %w", data, err)
		}
		hole = min(hole, im.size)
		if hole > data {
			if err := yield(data, hole); err != nil {
				return err
			}
		}
		off = hole
	}
	return nil
}

// qcow2Data yields the ranges whose clusters are allocated and not marked
// zero. Queries start on cluster boundaries (go-qcow2reader's Extent
// clips an unaligned start wrongly).
func (im *Image) qcow2Data(yield func(start, end int64) error) error {
	const step = 1 << 30
	var off int64
	for off < im.size {
		ext, err := im.q.Extent(off, min(step, im.size-off))
		if err != nil {
			return fmt.Errorf("qcow2 extent at %d: %w", off, err)
		}
		if ext.Length <= 0 {
			return fmt.Errorf("qcow2 extent at %d: empty", off)
		}
		if ext.Allocated && !ext.Zero {
			if err := yield(ext.Start, ext.Start+ext.Length); err != nil {
				return err
			}
		}
		off = ext.Start + ext.Length
	}
	return nil
}

// zeros is one block of zeros to compare against (bytes.Equal is the
// runtime's vectorised memequal).
var zeros = make([]byte, BlockSize)

func allZero(p []byte) bool { return bytes.Equal(p, zeros[:len(p)]) }
