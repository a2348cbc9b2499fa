package volume

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// The image formats a volume may have. Corral decides which of the two a
// file is by reading its first bytes itself (sniffFormat) and then always
// tells qemu-img and QEMU: no other format is ever opened, and qemu-img's
// own probing never runs.
const (
	FormatQcow2 = "qcow2"
	FormatRaw   = "raw"
)

var qcow2Magic = []byte("QFI\xfb")

// sniffFormat is the one place a volume file's format is decided: qcow2 if
// it starts with the qcow2 magic, raw otherwise. It is stable for files in
// the store: a guest writes only inside a qcow2's data clusters (never its
// header), raw volumes are attached read-only, and Fetch refuses a file
// declared raw that starts with the qcow2 magic.
func sniffFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var m [4]byte
	if _, err := io.ReadFull(f, m[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return FormatRaw, nil
		}
		return "", err
	}
	if bytes.Equal(m[:], qcow2Magic) {
		return FormatQcow2, nil
	}
	return FormatRaw, nil
}

// qcow2 header extension types (docs/interop/qcow2.txt in QEMU).
const (
	extEnd      = 0x00000000
	extDataFile = 0x44415441
	extCrypto   = 0x0537be77
)

// qcow2 incompatible feature bits.
const (
	incompatDirty              = 1 << 0
	incompatCorrupt            = 1 << 1
	incompatDataFile           = 1 << 2
	incompatCompression        = 1 << 3
	incompatExtendedL2         = 1 << 4
	incompatKnown       uint64 = incompatDirty | incompatCorrupt | incompatDataFile | incompatCompression | incompatExtendedL2
)

// qcow2Header is what refuseQcow2 needs from a qcow2 header: every
// field that makes QEMU open another file or need a secret, and what
// marks a header QEMU would refuse.
type qcow2Header struct {
	Version     uint32
	Size        uint64
	BackingFile string // the name as stored (may be a json: pseudo-protocol)
	HasBacking  bool
	DataFile    string // the external data file extension, if any
	HasDataFile bool   // incompatible bit 2 or the extension
	Encrypted   bool   // crypt_method != 0 or a crypto header extension
	Incompat    uint64
}

// maxHeaderCluster bounds how much of the first cluster is read to walk
// the header extensions (QEMU's clusters are at most 2 MiB).
const maxHeaderCluster = 2 << 20

// parseQcow2Header reads the header and header extensions of a qcow2
// image from r without trusting any of it: offsets and lengths are
// checked against the first cluster and the file, and a malformed header
// is an error. It never opens another file.
func parseQcow2Header(r io.ReaderAt) (qcow2Header, error) {
	var h qcow2Header
	var fixed [104]byte
	n, err := r.ReadAt(fixed[:], 0)
	if n < 72 {
		if err == nil || errors.Is(err, io.EOF) {
			return h, errors.New("qcow2 header truncated")
		}
		return h, err
	}
	be := binary.BigEndian
	if !bytes.Equal(fixed[:4], qcow2Magic) {
		return h, errors.New("no qcow2 magic")
	}
	h.Version = be.Uint32(fixed[4:8])
	if h.Version != 2 && h.Version != 3 {
		return h, fmt.Errorf("qcow2 version %d; want 2 or 3", h.Version)
	}
	backingOff := be.Uint64(fixed[8:16])
	backingLen := be.Uint32(fixed[16:20])
	clusterBits := be.Uint32(fixed[20:24])
	h.Size = be.Uint64(fixed[24:32])
	if be.Uint32(fixed[32:36]) != 0 {
		h.Encrypted = true
	}
	if clusterBits < 9 || clusterBits > 21 {
		return h, fmt.Errorf("qcow2 cluster_bits %d out of range", clusterBits)
	}
	cluster := uint64(1) << clusterBits
	extStart := uint64(72)
	if h.Version == 3 {
		if n < 104 {
			return h, errors.New("qcow2 v3 header truncated")
		}
		h.Incompat = be.Uint64(fixed[72:80])
		if h.Incompat&incompatDataFile != 0 {
			h.HasDataFile = true
		}
		hl := be.Uint32(fixed[100:104])
		if hl < 104 || uint64(hl) > cluster || hl%8 != 0 {
			return h, fmt.Errorf("qcow2 header_length %d invalid", hl)
		}
		extStart = uint64(hl)
	}
	if backingOff != 0 || backingLen != 0 {
		h.HasBacking = true
		name, err := readName(r, backingOff, backingLen)
		if err != nil {
			h.BackingFile = fmt.Sprintf("<unreadable: %v>", err)
		} else {
			h.BackingFile = name
		}
	}
	// Header extensions: from the end of the header to the end of the
	// first cluster (or the backing file name, which QEMU places there).
	end := min(cluster, maxHeaderCluster)
	if h.HasBacking && backingOff > extStart && backingOff < end {
		end = backingOff
	}
	for off := extStart; off+8 <= end; {
		var eh [8]byte
		if _, err := r.ReadAt(eh[:], int64(off)); err != nil {
			return h, fmt.Errorf("qcow2 header extension at %d: %w", off, err)
		}
		typ, l := be.Uint32(eh[0:4]), uint64(be.Uint32(eh[4:8]))
		if typ == extEnd {
			break
		}
		off += 8
		if off+l > end {
			return h, fmt.Errorf("qcow2 header extension %#x at %d: length %d runs past the first cluster", typ, off-8, l)
		}
		switch typ {
		case extDataFile:
			h.HasDataFile = true
			name, err := readName(r, off, uint32(l))
			if err != nil {
				name = fmt.Sprintf("<unreadable: %v>", err)
			}
			h.DataFile = name
		case extCrypto:
			h.Encrypted = true
		}
		off += (l + 7) &^ 7
	}
	return h, nil
}

// readName reads a file name stored in the image (at most 1023 bytes, as
// QEMU allows for a backing file name).
func readName(r io.ReaderAt, off uint64, l uint32) (string, error) {
	if l == 0 {
		return "", nil
	}
	if l > 1023 {
		return "", fmt.Errorf("name length %d > 1023", l)
	}
	if off > 1<<62 {
		return "", fmt.Errorf("name offset %d out of range", off)
	}
	buf := make([]byte, l)
	if _, err := r.ReadAt(buf, int64(off)); err != nil {
		return "", err
	}
	return string(buf), nil
}

// refuseQcow2 explains why a qcow2 header makes an image unfit to be a
// volume ("" when it is fit): anything that makes QEMU open another file
// or need a secret is refused, as is a header QEMU would refuse anyway.
func refuseQcow2(h qcow2Header) string {
	switch {
	case h.HasBacking:
		return "it has a backing file " + quoteName(h.BackingFile) + ": a fetched image must be self-contained"
	case h.HasDataFile:
		return "it has an external data file " + quoteName(h.DataFile) + ": a fetched image must be self-contained"
	case h.Encrypted:
		return "it is encrypted: the node holds no image secrets"
	case h.Incompat&^incompatKnown != 0:
		return fmt.Sprintf("it has unknown incompatible features %#x", h.Incompat&^incompatKnown)
	case h.Incompat&incompatCorrupt != 0:
		return "it is marked corrupt"
	case h.Size == 0:
		return "its virtual size is 0"
	}
	return ""
}

// quoteName quotes a name taken from an image for an error message,
// shortened so a hostile image cannot flood logs.
func quoteName(s string) string {
	const maxLen = 200
	if len(s) > maxLen {
		return strconv.Quote(s[:maxLen]) + "..."
	}
	return strconv.Quote(s)
}
