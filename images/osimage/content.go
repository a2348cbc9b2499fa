package osimage

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
)

// qcow2 header fields (big-endian), from the qcow2 specification.
const (
	qcow2Magic     = "QFI\xfb"
	qcow2V2Header  = 72  // a version 2 header's length
	qcow2V3Header  = 104 // the shortest version 3 header
	qcow2MinClBits = 9
	qcow2MaxClBits = 21
	// incompatible feature bits a standalone disk image must not have.
	qcow2Corrupt      = 1 << 1
	qcow2ExternalData = 1 << 2
)

// qcow2Info is what the header says.
type qcow2Info struct {
	version     uint32
	virtualSize uint64
}

// checkQCOW2 checks that hdr (the file's first bytes, at most
// qcow2V3Header of them) is a qcow2 header of version 2 or 3 describing a
// disk a machine can be deployed from on its own: no backing file, no
// encryption, not marked corrupt, no external data file. Its error says
// which field is wrong.
func checkQCOW2(hdr []byte) (qcow2Info, error) {
	if len(hdr) < 4 || string(hdr[:4]) != qcow2Magic {
		return qcow2Info{}, errors.New("declared qcow2 but the file does not start with the qcow2 magic QFI\\xfb")
	}
	if len(hdr) < qcow2V2Header {
		return qcow2Info{}, fmt.Errorf("declared qcow2 but the file ends inside the qcow2 header (%d bytes)", len(hdr))
	}
	be := binary.BigEndian
	info := qcow2Info{version: be.Uint32(hdr[4:]), virtualSize: be.Uint64(hdr[24:])}
	switch info.version {
	case 2:
	case 3:
		if len(hdr) < qcow2V3Header {
			return qcow2Info{}, fmt.Errorf("declared qcow2 but the file ends inside the qcow2 version 3 header (%d bytes)", len(hdr))
		}
		if hl := be.Uint32(hdr[100:]); hl < qcow2V3Header {
			return qcow2Info{}, fmt.Errorf("qcow2 header length %d is shorter than %d", hl, qcow2V3Header)
		}
		if f := be.Uint64(hdr[72:]); f&(qcow2Corrupt|qcow2ExternalData) != 0 {
			return qcow2Info{}, fmt.Errorf("qcow2 incompatible features %#x: the image is marked corrupt or keeps its data in an external file", f)
		}
	default:
		return qcow2Info{}, fmt.Errorf("qcow2 version %d: only versions 2 and 3 exist", info.version)
	}
	if off := be.Uint64(hdr[8:]); off != 0 {
		return qcow2Info{}, errors.New("the qcow2 image has a backing file: an OS image must stand on its own (qemu-img convert it first)")
	}
	if cb := be.Uint32(hdr[20:]); cb < qcow2MinClBits || cb > qcow2MaxClBits {
		return qcow2Info{}, fmt.Errorf("qcow2 cluster_bits %d is outside %d..%d", cb, qcow2MinClBits, qcow2MaxClBits)
	}
	if m := be.Uint32(hdr[32:]); m != 0 {
		return qcow2Info{}, fmt.Errorf("the qcow2 image is encrypted (method %d): it cannot be written to a disk", m)
	}
	if info.virtualSize == 0 {
		return qcow2Info{}, errors.New("the qcow2 header's disk size is 0")
	}
	return info, nil
}

// want is what received bytes must be.
type want struct {
	sha256 string
	format osimagev1.OSImageFormat
	// size is the exact size, or -1 when unknown (a download without a
	// Content-Length).
	size int64
	// max bounds the size either way.
	max int64
}

// stored is a file in the content store.
type stored struct {
	path        string
	size        int64
	virtualSize uint64
}

// contentPath is where the content store of the catalog directory dir
// keeps sum.
func contentPath(dir, sum string) string { return filepath.Join(dir, images.ContentDir, sum) }

// headWriter keeps the first qcow2V3Header bytes written through it and,
// for a declared qcow2, checks them as soon as they are all there, so a
// file that is not qcow2 is refused at its first bytes, not its last.
type headWriter struct {
	w       io.Writer
	check   bool
	head    []byte
	checked bool
	info    qcow2Info
	n       int64
	// progress, when set, is told the bytes written so far.
	progress func(int64)
}

func (h *headWriter) Write(p []byte) (int, error) {
	if len(h.head) < qcow2V3Header {
		h.head = append(h.head, p[:min(len(p), qcow2V3Header-len(h.head))]...)
		if h.check && len(h.head) == qcow2V3Header {
			if err := h.finish(); err != nil {
				return 0, err
			}
		}
	}
	n, err := h.w.Write(p)
	h.n += int64(n)
	if h.progress != nil {
		h.progress(h.n)
	}
	return n, err
}

// finish checks the header once (at the end for a file shorter than the
// longest header).
func (h *headWriter) finish() error {
	if !h.check || h.checked {
		return nil
	}
	h.checked = true
	info, err := checkQCOW2(h.head)
	if err != nil {
		return apierr.Invalidf("%v", err)
	}
	h.info = info
	return nil
}

// receive stores what r reads as the content w describes in the content
// store of the catalog directory dir: the bytes go to a temporary file
// beside their final place, hashed as they arrive and never more than
// w.max (or w.size, when known) of them plus one (zero blocks left as
// holes: sparseFile), and the file is renamed
// to images.ContentDir/<sha256> only when its size, SHA-256 and declared
// format are right. Otherwise nothing is left behind and the error
// (InvalidArgument for a mismatch, ResourceExhausted beyond w.max) says
// what was wrong and how many bytes came. progress, when set, is told the
// bytes received so far. Concurrent calls for the same content are safe:
// the last rename wins with the same bytes.
func receive(dir string, w want, r io.Reader, progress func(int64)) (stored, error) {
	if err := images.CheckSHA256(w.sha256); err != nil {
		return stored{}, apierr.Invalidf("sha256 %q: want 64 lower-case hex digits", w.sha256)
	}
	if w.size > w.max {
		return stored{}, apierr.Exhaustedf("the image is %d bytes, more than the %d this appliance accepts (--os-image-max-bytes)", w.size, w.max)
	}
	cdir := filepath.Join(dir, images.ContentDir)
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		return stored{}, fmt.Errorf("osimage: %w", err)
	}
	dst := contentPath(dir, w.sha256)
	tmp, err := renameio.NewPendingFile(dst, renameio.WithTempDir(cdir), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return stored{}, fmt.Errorf("osimage: %w", err)
	}
	defer tmp.Cleanup() // after the rename, a no-op
	h := sha256.New()
	limit := w.max
	if w.size >= 0 {
		limit = w.size
	}
	sf := newSparseFile(tmp.File)
	hw := &headWriter{w: io.MultiWriter(sf, h), check: w.format == osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2, progress: progress}
	n, err := io.Copy(hw, io.LimitReader(r, limit+1))
	if err != nil {
		if errors.Is(err, apierr.ErrInvalid) {
			return stored{}, err
		}
		return stored{}, fmt.Errorf("receiving failed after %d bytes: %w", n, err)
	}
	switch {
	case n > limit && w.size >= 0:
		return stored{}, apierr.Invalidf("more than the %d bytes announced", w.size)
	case n > limit:
		return stored{}, apierr.Exhaustedf("more than %d bytes, the most this appliance accepts (--os-image-max-bytes)", w.max)
	case w.size >= 0 && n < w.size:
		return stored{}, apierr.Invalidf("truncated: %d of %d bytes", n, w.size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != w.sha256 {
		return stored{}, apierr.Invalidf("sha256 mismatch: the %d bytes received have sha256 %s, not the declared %s", n, got, w.sha256)
	}
	if err := hw.finish(); err != nil {
		return stored{}, err
	}
	if err := sf.finish(); err != nil {
		return stored{}, err
	}
	if err := tmp.CloseAtomicallyReplace(); err != nil {
		return stored{}, fmt.Errorf("osimage: %w", err)
	}
	vs := uint64(n)
	if hw.checked {
		vs = hw.info.virtualSize
	}
	return stored{path: dst, size: n, virtualSize: vs}, nil
}

// examine checks a file the content store already holds against the
// declared format (its hash was checked when it was stored) and returns
// what receive would have.
func examine(dir, sum string, format osimagev1.OSImageFormat) (stored, error) {
	p := contentPath(dir, sum)
	f, err := os.Open(p)
	if err != nil {
		return stored{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return stored{}, err
	}
	s := stored{path: p, size: st.Size(), virtualSize: uint64(st.Size())}
	if format == osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2 {
		head := make([]byte, qcow2V3Header)
		n, err := io.ReadFull(f, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return stored{}, err
		}
		info, err := checkQCOW2(head[:n])
		if err != nil {
			return stored{}, apierr.Invalidf("%v", err)
		}
		s.virtualSize = info.virtualSize
	}
	return s, nil
}
