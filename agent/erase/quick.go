package erase

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"golang.org/x/sys/unix"
)

// window is how much of each end of a disk and of each partition quick
// zeroes: it covers MBR and both GPTs, and the superblocks and labels of
// ext2/3/4, XFS, btrfs (primary), vfat, swap, LUKS, LVM and MD RAID
// (0.90 and 1.0 near the end, 1.1 and 1.2 near the start).
const window = mib

// quick zeroes the first and last MiB of the disk and of every partition,
// re-reads the partition table and reads every region back.
func (w *work) quick(ctx context.Context) (string, error) {
	regions, nparts := w.quickRegions()
	zero := make([]byte, window)
	for _, r := range regions {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if _, err := w.dev.WriteAt(zero[:r.n], r.off); err != nil {
			return "", fmt.Errorf("zero %s at %d: %w", humanSize(r.n), r.off, err)
		}
	}
	if err := w.dev.flush(); err != nil {
		return "", err
	}
	if err := w.dev.reread(); err != nil {
		// A loop device without partition scanning answers EINVAL: it
		// has no partitions for the kernel to forget.
		if !errors.Is(err, unix.EINVAL) {
			return "", fmt.Errorf("re-read partition table (BLKRRPART): %w", err)
		}
		w.log.Info("no partition re-read", "err", err)
	}
	for _, r := range regions {
		if err := w.checkZero(r); err != nil {
			return "", err
		}
	}
	w.log.Info("quick erase", "regions", len(regions), "partitions", nparts)
	return fmt.Sprintf("partition tables and signatures erased (%d regions of %d partition%s and the disk read back zero)",
		len(regions), nparts, plural(nparts)), nil
}

// quickRegions are the first and last window of the disk and of every
// partition, merged where they overlap: the kernel's partitions and those
// the disk's own MBR and GPT name (a kernel without a table's parser, or
// a loop device without partition scanning, lists none).
func (w *work) quickRegions() ([]extent, int) {
	parts := slices.Clone(w.d.parts)
	for _, p := range tablePartitions(w.dev, w.d.size) {
		if !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	var rs []extent
	add := func(off, n int64) {
		off, end := max(off, 0), min(off+n, w.d.size)
		if end > off {
			rs = append(rs, extent{off, end - off})
		}
	}
	for _, p := range append([]extent{{0, w.d.size}}, parts...) {
		end := min(p.off+p.n, w.d.size) // a partition past the disk's end is clipped
		n := min(window, end-p.off)
		add(p.off, n)
		add(end-n, n)
	}
	slices.SortFunc(rs, func(a, b extent) int { return int(max(-1, min(1, a.off-b.off))) })
	var merged []extent
	for _, r := range rs {
		if l := len(merged) - 1; l >= 0 && r.off <= merged[l].off+merged[l].n {
			merged[l].n = max(merged[l].n, r.off+r.n-merged[l].off)
			continue
		}
		merged = append(merged, r)
	}
	// No region longer than the zero buffer.
	var out []extent
	for _, r := range merged {
		for r.n > window {
			out = append(out, extent{r.off, window})
			r.off, r.n = r.off+window, r.n-window
		}
		out = append(out, r)
	}
	return out, len(parts)
}

// tablePartitions reads the partitions the disk's MBR (primary entries)
// and GPT (primary header, or the backup at the end, for 512- and
// 4096-byte sectors) name, clipped to the disk. Damaged tables name none.
func tablePartitions(r interface {
	ReadAt([]byte, int64) (int, error)
}, size int64) []extent {
	var out []extent
	add := func(off, n int64) {
		if off > 0 && n > 0 && off < size {
			e := extent{off, min(n, size-off)}
			if !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	mbr := make([]byte, 512)
	if _, err := r.ReadAt(mbr, 0); err == nil && mbr[510] == 0x55 && mbr[511] == 0xaa {
		for i := range 4 {
			e := mbr[446+16*i:]
			typ := e[4]
			if typ == 0 || typ == 0xee { // empty, GPT protective
				continue
			}
			add(int64(binary.LittleEndian.Uint32(e[8:]))*512, int64(binary.LittleEndian.Uint32(e[12:]))*512)
		}
	}
	for _, ss := range []int64{512, 4096} {
		if size < 2*ss {
			continue
		}
		for _, lba := range []int64{1, size/ss - 1} {
			parts, ok := readGPT(r, ss, lba)
			if !ok {
				continue
			}
			for _, p := range parts {
				add(p.off, p.n)
			}
			break
		}
	}
	return out
}

// readGPT reads the GPT header at lba and its entries; ok only when the
// header's and the entries' CRCs hold.
func readGPT(r interface {
	ReadAt([]byte, int64) (int, error)
}, ss, lba int64) ([]extent, bool) {
	h := make([]byte, ss)
	if _, err := r.ReadAt(h, lba*ss); err != nil || string(h[:8]) != "EFI PART" {
		return nil, false
	}
	hsize := binary.LittleEndian.Uint32(h[12:])
	if hsize < 92 || int64(hsize) > ss {
		return nil, false
	}
	want := binary.LittleEndian.Uint32(h[16:])
	c := slices.Clone(h[:hsize])
	clear(c[16:20])
	if crc32.ChecksumIEEE(c) != want {
		return nil, false
	}
	first := int64(binary.LittleEndian.Uint64(h[72:]))
	n := binary.LittleEndian.Uint32(h[80:])
	esize := binary.LittleEndian.Uint32(h[84:])
	if esize < 128 || esize > 4096 || n == 0 || n > 1024 {
		return nil, false
	}
	entries := make([]byte, int64(n)*int64(esize))
	if _, err := r.ReadAt(entries, first*ss); err != nil {
		return nil, false
	}
	if crc32.ChecksumIEEE(entries) != binary.LittleEndian.Uint32(h[88:]) {
		return nil, false
	}
	var out []extent
	for i := range int(n) {
		e := entries[i*int(esize):]
		if allZero(e[:16]) {
			continue
		}
		start := int64(binary.LittleEndian.Uint64(e[32:]))
		end := int64(binary.LittleEndian.Uint64(e[40:]))
		if end >= start {
			out = append(out, extent{start * ss, (end - start + 1) * ss})
		}
	}
	return out, true
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
