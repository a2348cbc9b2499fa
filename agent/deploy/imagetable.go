package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/corralhq/corral/agent/diskwrite"
	"github.com/corralhq/corral/internal/diskmap"
)

// imageHeadSize is how much of the image's start is read to find its
// partition table: the MBR, a GPT's header and its entry array (at most
// 128 entries of 128 bytes after the header, as every partitioner writes
// it).
const imageHeadSize = 64 << 10

// imagePart is one partition of the image's own table, in image bytes.
type imagePart struct {
	index       int
	start, size int64
}

func (p imagePart) end() int64 { return p.start + p.size }

// imageTable is what a partitioned deploy takes from the image: the
// partition holding the root filesystem, the boot partition (an EFI
// system partition, or on an MBR the active FAT partition SYSLINUX boots
// from), and the MBR's boot code.
type imageTable struct {
	scheme   string // "MBR" or "GPT"
	root     *imagePart
	boot     *imagePart // nil when the image has none
	bootCode []byte     // the first 440 bytes (MBR boot code), nil when all zero
}

// GPT partition type GUIDs as go-diskfs and the specification spell them.
const (
	guidESP       = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	guidLinuxFS   = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	guidRootX8664 = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
	guidLinuxRAID = "A19D880F-05FC-4D3B-A006-743F0F84911E"
)

// readImageHead fetches the image's first n bytes, checking the SHA-256
// of every extent it touches (whole extents are fetched and hashed; only
// their part before n is kept). Gaps between extents read zero.
func readImageHead(ctx context.Context, fetch diskwrite.Fetch, m *diskmap.Map, n int64) ([]byte, error) {
	n = min(n, m.Size)
	head := make([]byte, n)
	for _, e := range m.Extents {
		if e.Offset >= n {
			break
		}
		err := fetchExtent(ctx, fetch, e, func(off int64, p []byte) error {
			if off < n {
				copy(head[off:], p[:min(int64(len(p)), n-off)])
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return head, nil
}

// fetchExtent fetches extent e whole, hands its bytes to use in order
// (image offset, bytes) and fails when they do not hash to e's SHA-256.
// use may have acted on bytes of a failing extent: callers write only
// into places the deploy overwrites anyway, or retry.
func fetchExtent(ctx context.Context, fetch diskwrite.Fetch, e diskmap.Extent, use func(off int64, p []byte) error) error {
	rc, err := fetch(ctx, e.Offset, e.Length)
	if err != nil {
		return fmt.Errorf("fetch extent %v: %w", e, err)
	}
	defer rc.Close()
	h := sha256.New()
	buf := make([]byte, min(e.Length, 1<<20))
	for off := e.Offset; off < e.End(); {
		p := buf[:min(int64(len(buf)), e.End()-off)]
		if _, err := io.ReadFull(rc, p); err != nil {
			return fmt.Errorf("fetch extent %v at %d: %w", e, off, err)
		}
		h.Write(p)
		if err := use(off, p); err != nil {
			return err
		}
		off += int64(len(p))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != e.SHA256 {
		return fmt.Errorf("extent %v: %w: got %s", e, diskwrite.ErrHashMismatch, got)
	}
	return nil
}

// parseImageTable reads the partition table at the start of an image
// (512-byte sectors) and picks its root and boot partitions.
func parseImageTable(head []byte, size int64) (*imageTable, error) {
	if len(head) < 1024 || head[510] != 0x55 || head[511] != 0xaa {
		return nil, fmt.Errorf("%w: the image holds no partition table (an MBR or a GPT at 512-byte sectors): a layout needs one to find the image's root filesystem", ErrTable)
	}
	it := &imageTable{}
	if code := head[:440]; !allZero(code) {
		it.bootCode = append([]byte(nil), code...)
	}
	var parts []imagePart
	var roots, boots []int // indexes into parts, best first
	if string(head[512:520]) == "EFI PART" {
		it.scheme = "GPT"
		lba := int64(binary.LittleEndian.Uint64(head[512+72:]))
		count := int64(binary.LittleEndian.Uint32(head[512+80:]))
		esz := int64(binary.LittleEndian.Uint32(head[512+84:]))
		if esz < 128 || count > 1024 || lba < 2 || lba*512+count*esz > int64(len(head)) {
			return nil, fmt.Errorf("%w: the image's GPT entry array (%d entries of %d bytes at sector %d) is not within its first %d bytes", ErrTable, count, esz, lba, len(head))
		}
		var linux []int
		for i := range count {
			b := head[lba*512+i*esz:]
			typ := guidString(b[:16])
			first, last := int64(binary.LittleEndian.Uint64(b[32:])), int64(binary.LittleEndian.Uint64(b[40:]))
			if typ == "00000000-0000-0000-0000-000000000000" || last < first {
				continue
			}
			p := imagePart{index: int(i) + 1, start: first * 512, size: (last - first + 1) * 512}
			switch typ {
			case guidRootX8664:
				roots = append(roots, len(parts))
			case guidLinuxFS:
				linux = append(linux, len(parts))
			case guidESP:
				boots = append(boots, len(parts))
			}
			parts = append(parts, p)
		}
		roots = append(roots, largest(parts, linux)...)
	} else {
		it.scheme = "MBR"
		var linux, fat []int
		for i := range 4 {
			b := head[446+16*i:]
			typ := b[4]
			p := imagePart{index: i + 1, start: int64(binary.LittleEndian.Uint32(b[8:])) * 512, size: int64(binary.LittleEndian.Uint32(b[12:])) * 512}
			if typ == 0 || p.size == 0 {
				continue
			}
			switch {
			case typ == 0xee:
				return nil, fmt.Errorf("%w: the image has a protective MBR but no GPT at 512-byte sectors", ErrTable)
			case typ == 0x83:
				linux = append(linux, len(parts))
			case typ == 0xef:
				boots = append(boots, len(parts))
			case b[0] == 0x80 && (typ == 0x01 || typ == 0x04 || typ == 0x06 || typ == 0x0b || typ == 0x0c || typ == 0x0e):
				fat = append(fat, len(parts))
			}
			parts = append(parts, p)
		}
		roots = largest(parts, linux)
		boots = append(boots, fat...)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("%w: the image's %s has no Linux partition to take the root filesystem from", ErrTable, it.scheme)
	}
	r := parts[roots[0]]
	it.root = &r
	if len(boots) > 0 {
		b := parts[boots[0]]
		it.boot = &b
	}
	for _, p := range []*imagePart{it.root, it.boot} {
		if p != nil && p.end() > size {
			return nil, fmt.Errorf("%w: the image's partition %d ends at %d, past the image's end (%d)", ErrTable, p.index, p.end(), size)
		}
	}
	return it, nil
}

// largest orders idx (into parts) by size, the largest first.
func largest(parts []imagePart, idx []int) []int {
	out := append([]int(nil), idx...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && parts[out[j]].size > parts[out[j-1]].size; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// guidString renders a GPT GUID (mixed-endian on disk) the way go-diskfs
// names types.
func guidString(b []byte) string {
	return strings.ToUpper(fmt.Sprintf("%08x-%04x-%04x-%x-%x",
		binary.LittleEndian.Uint32(b[0:4]), binary.LittleEndian.Uint16(b[4:6]), binary.LittleEndian.Uint16(b[6:8]), b[8:10], b[10:16]))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// subMap is the part [start, end) of m as a map of its own (offsets
// shifted by -start): the extents wholly inside it, and apart the extents
// that straddle its edges (their hash covers bytes outside; writeEdges
// writes their inside part).
func subMap(m *diskmap.Map, start, end int64) (*diskmap.Map, []diskmap.Extent) {
	out := &diskmap.Map{Version: m.Version, Size: end - start, BlockSize: m.BlockSize}
	var edges []diskmap.Extent
	for _, e := range m.Extents {
		switch {
		case e.End() <= start || e.Offset >= end:
		case e.Offset >= start && e.End() <= end:
			out.Extents = append(out.Extents, diskmap.Extent{Offset: e.Offset - start, Length: e.Length, SHA256: e.SHA256})
		default:
			edges = append(edges, e)
		}
	}
	return out, edges
}

// shifted fetches image bytes for a map made by subMap(…, start, …).
func shifted(fetch diskwrite.Fetch, start int64) diskwrite.Fetch {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		return fetch(ctx, off+start, length)
	}
}

// writeEdges writes, into dev, the part inside [start, end) of each
// straddling extent, fetched whole and checked against its hash (with
// attempts tries each).
func writeEdges(ctx context.Context, fetch diskwrite.Fetch, dev string, start, end int64, edges []diskmap.Extent, attempts int) error {
	if len(edges) == 0 {
		return nil
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, e := range edges {
		for attempt := 1; ; attempt++ {
			err = fetchExtent(ctx, fetch, e, func(off int64, p []byte) error {
				lo, hi := max(off, start), min(off+int64(len(p)), end)
				if lo >= hi {
					return nil
				}
				_, err := f.WriteAt(p[lo-off:hi-off], lo-start)
				return err
			})
			if err == nil || attempt >= max(attempts, 1) || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	return f.Sync()
}
