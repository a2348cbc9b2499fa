package deploy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/fat16"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"
)

// table is the image's partition table, planned for the disk: its last
// partition grown to the seed, the seed's place and slot chosen. Both
// kinds are read and written with go-diskfs.
type table interface {
	kind() string
	// grow writes the table with the last partition grown.
	grow(f *os.File) error
	// addSeed writes the table with the seed partition added.
	addSeed(f *os.File) error
	lastIndex() int
	lastSize() int64
	seedIndex() int
	seedStart() int64 // bytes
}

// readTable reads the partition table the image put on the disk (size
// bytes, sector-byte logical sectors) and plans the growth and the seed,
// refusing a table that cannot take them.
func readTable(f *os.File, size int64, sector int) (table, error) {
	head := make([]byte, 2*sector)
	if _, err := f.ReadAt(head, 0); err != nil {
		return nil, fmt.Errorf("read the partition table: %w", err)
	}
	switch {
	case string(head[sector:sector+8]) == "EFI PART":
		return readGPT(f, size, sector, head)
	case head[510] == 0x55 && head[511] == 0xaa:
		return readMBR(f, size, sector)
	}
	return nil, fmt.Errorf("%w: the image holds no partition table (MBR or GPT at %d-byte sectors): a whole-disk image needs one for its last partition and the seed", ErrTable, sector)
}

// alignDown rounds a byte offset down to the seed's alignment.
func alignDown(n int64) int64 { return n / alignment * alignment }

// mbrTable is an MBR: four primary entries, 512-byte sectors, 2^32 of
// them at most.
type mbrTable struct {
	t          *mbr.Table
	size       int64
	last, free int // indexes into t.Partitions
	start      int64
}

func readMBR(f *os.File, size int64, sector int) (*mbrTable, error) {
	if sector != 512 {
		return nil, fmt.Errorf("%w: an MBR on a disk with %d-byte sectors is not supported by this agent yet", ErrUnsupported, sector)
	}
	t, err := mbr.Read(f, 512, 512)
	if err != nil {
		return nil, fmt.Errorf("%w: the image's MBR: %v", ErrTable, err)
	}
	m := &mbrTable{t: t, size: size, last: -1, free: -1}
	var lastEnd int64
	for i, p := range t.Partitions {
		switch p.Type {
		case mbr.Empty:
			if m.free < 0 {
				m.free = i
			}
			continue
		case mbr.GPTProtective:
			return nil, fmt.Errorf("%w: the image has a protective MBR but no GPT at 512-byte sectors", ErrTable)
		case mbr.ExtendedCHS, mbr.ExtendedLBA, mbr.LinuxExtended:
			return nil, fmt.Errorf("%w: the image's MBR has an extended partition (%d); logical partitions are not supported by this agent yet", ErrUnsupported, i+1)
		default: // a partition of the image's own: the last one grows
		}
		if end := int64(p.Start) + int64(p.Size); end > lastEnd {
			lastEnd, m.last = end, i
		}
	}
	if m.last < 0 {
		return nil, fmt.Errorf("%w: the image's MBR has no partition to grow", ErrTable)
	}
	if m.free < 0 {
		return nil, fmt.Errorf("%w: the four primary entries of the image's MBR are all used: no free slot for the seed partition", ErrTable)
	}
	m.start = alignDown(min(size, int64(1)<<32*512) - SeedSize)
	if lastEnd*512 > m.start {
		return nil, fmt.Errorf("%w: MBR partition %d ends at %d, past the seed partition's place at %d", ErrTable, m.last+1, lastEnd*512, m.start)
	}
	return m, nil
}

func (m *mbrTable) kind() string     { return "MBR" }
func (m *mbrTable) lastIndex() int   { return m.last + 1 }
func (m *mbrTable) seedIndex() int   { return m.free + 1 }
func (m *mbrTable) seedStart() int64 { return m.start }
func (m *mbrTable) lastSize() int64  { return int64(m.t.Partitions[m.last].Size) * 512 }

// lbaOnly marks an entry's CHS fields as "use the LBA fields" (the values
// partitioners write past the CHS range).
func lbaOnly(p *mbr.Partition) {
	p.StartHead, p.StartSector, p.StartCylinder = 0xfe, 0xff, 0xff
	p.EndHead, p.EndSector, p.EndCylinder = 0xfe, 0xff, 0xff
}

func (m *mbrTable) grow(f *os.File) error {
	p := m.t.Partitions[m.last]
	p.Size = uint32(m.start/512 - int64(p.Start))
	lbaOnly(p)
	// A GPT an earlier OS left has its backup in the disk's last 33
	// sectors; beside an MBR it is a stale signature that partitioners
	// warn about. No partition uses them (the seed is made over them
	// after this).
	if err := zero(f, m.size-33*512, 33*512); err != nil {
		return fmt.Errorf("clear the disk's last sectors: %w", err)
	}
	return m.write(f)
}

func (m *mbrTable) addSeed(f *os.File) error {
	p := m.t.Partitions[m.free]
	*p = mbr.Partition{Index: m.free + 1, Type: mbr.Fat16bLBA, Start: uint32(m.start / 512), Size: SeedSize / 512}
	lbaOnly(p)
	return m.write(f)
}

func (m *mbrTable) write(f *os.File) error {
	if err := m.t.Write(f, m.size); err != nil {
		return fmt.Errorf("write the MBR: %w", err)
	}
	return f.Sync()
}

// gptTable is a GUID partition table moved to the disk's real end.
type gptTable struct {
	t      *gpt.Table
	size   int64
	sector int
	last   *gpt.Partition
	free   int // entry number of the seed
	start  int64
	pmbr   bool // the image had a protective MBR
}

func readGPT(f *os.File, size int64, sector int, head []byte) (*gptTable, error) {
	t, err := gpt.Read(f, sector, sector)
	if err != nil {
		return nil, fmt.Errorf("%w: the image's GPT: %v", ErrTable, err)
	}
	entries := int(binary.LittleEndian.Uint32(head[sector+80 : sector+84]))
	g := &gptTable{t: t, size: size / int64(sector) * int64(sector), sector: sector, pmbr: t.ProtectiveMBR}
	// The backup header and array move from the image's end to the disk's.
	t.Resize(uint64(g.size))
	ss := int64(sector)
	g.start = alignDown(int64(t.LastDataSector()+1)*ss - SeedSize)
	used := map[int]bool{}
	for _, p := range t.Partitions {
		used[p.Index] = true
		if g.last == nil || p.End > g.last.End {
			g.last = p
		}
	}
	if g.last == nil {
		return nil, fmt.Errorf("%w: the image's GPT has no partition to grow", ErrTable)
	}
	if int64(g.last.End+1)*ss > g.start {
		return nil, fmt.Errorf("%w: GPT partition %d ends at %d, past the seed partition's place at %d", ErrTable, g.last.Index, int64(g.last.End+1)*ss, g.start)
	}
	g.free = -1
	for i := 1; i <= entries; i++ {
		if !used[i] {
			g.free = i
			break
		}
	}
	if g.free < 0 {
		return nil, fmt.Errorf("%w: all %d entries of the image's GPT are used: no free slot for the seed partition", ErrTable, entries)
	}
	return g, nil
}

func (g *gptTable) kind() string     { return "GPT" }
func (g *gptTable) lastIndex() int   { return g.last.Index }
func (g *gptTable) seedIndex() int   { return g.free }
func (g *gptTable) seedStart() int64 { return g.start }
func (g *gptTable) lastSize() int64  { return int64(g.last.End-g.last.Start+1) * int64(g.sector) }

func (g *gptTable) grow(f *os.File) error {
	ss := uint64(g.sector)
	g.last.End = uint64(g.start)/ss - 1
	g.last.Size = (g.last.End - g.last.Start + 1) * ss
	return g.write(f)
}

func (g *gptTable) addSeed(f *os.File) error {
	ss := uint64(g.sector)
	start := uint64(g.start) / ss
	g.t.Partitions = append(g.t.Partitions, &gpt.Partition{
		Index: g.free, Start: start, End: start + SeedSize/ss - 1, Size: SeedSize,
		Type: gpt.MicrosoftBasicData, Name: SeedLabel,
	})
	return g.write(f)
}

// write writes both headers and arrays (backup first; go-diskfs computes
// the CRCs) and then the protective MBR's size by hand: go-diskfs would
// truncate it to 32 bits on a disk past 2 TiB, where it must read
// 0xffffffff.
func (g *gptTable) write(f *os.File) error {
	g.t.ProtectiveMBR = false
	if err := g.t.Write(f, g.size); err != nil {
		return fmt.Errorf("write the GPT: %w", err)
	}
	if g.pmbr {
		entry := make([]byte, 16)
		if _, err := f.ReadAt(entry, 446); err != nil {
			return fmt.Errorf("read the protective MBR: %w", err)
		}
		if entry[4] == 0xee {
			binary.LittleEndian.PutUint32(entry[12:16], uint32(min(g.size/int64(g.sector)-1, 0xffffffff)))
			if _, err := f.WriteAt(entry[12:16], 446+12); err != nil {
				return fmt.Errorf("write the protective MBR: %w", err)
			}
		}
	}
	return f.Sync()
}

// makeSeed makes the CIDATA FAT filesystem in [start, start+size) of f
// with files, and reads them back. At SeedSize it is FAT16 (2 KiB
// clusters): a FAT32 volume needs at least 65525 clusters (some 33 MiB),
// and one made smaller is misread by tools that go by the cluster count
// (mtools sees no files; fsck.fat warns).
func makeSeed(f *os.File, start, size int64, files []seedFile) error {
	// Whatever the disk held there (an older seed, a filesystem's
	// superblock) must not show through.
	if err := zero(f, start, size); err != nil {
		return fmt.Errorf("clear: %w", err)
	}
	b := file.New(f, false)
	fs, err := fat16.Create(b, size, start, 512, SeedLabel, false)
	if err != nil {
		return err
	}
	for _, sf := range files {
		w, err := fs.OpenFile("/"+sf.name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("create %s: %w", sf.name, err)
		}
		if _, err := w.Write(sf.data); err != nil {
			w.Close()
			return fmt.Errorf("write %s: %w", sf.name, err)
		}
		if err := w.Close(); err != nil {
			return fmt.Errorf("write %s: %w", sf.name, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	back, err := fat16.Read(b, size, start, 512)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if got := strings.TrimSpace(back.Label()); got != SeedLabel {
		return fmt.Errorf("read back: label %q, want %q", got, SeedLabel)
	}
	sizes := map[string]int64{}
	entries, err := back.ReadDir(".")
	if err != nil {
		return fmt.Errorf("read back the directory: %w", err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			sizes[e.Name()] = info.Size()
		}
	}
	for _, sf := range files {
		if n, ok := sizes[sf.name]; !ok || n != int64(len(sf.data)) {
			return fmt.Errorf("read back %s: the directory says %d bytes (listed: %t), %d were written", sf.name, n, ok, len(sf.data))
		}
		data, err := readSeedFile(back, sf.name, len(sf.data))
		if err != nil {
			return fmt.Errorf("read back %s: %w", sf.name, err)
		}
		if !bytes.Equal(data, sf.data) {
			return fmt.Errorf("read back %s: %d bytes differ from the %d written", sf.name, len(data), len(sf.data))
		}
	}
	return nil
}

// readSeedFile reads n bytes of name in one read: go-diskfs's FAT reader
// (v1.9.4) returns bytes past a file's end when it is read in several
// smaller reads (io.ReadAll, as its ReadFile does), for files of 513 to
// 2047 bytes — the file on the disk is right (mtools reads it whole).
func readSeedFile(fs *fat16.FileSystem, name string, n int) ([]byte, error) {
	f, err := fs.OpenFile("/"+name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// zero writes zeros over [off, off+n) of f.
func zero(f *os.File, off, n int64) error {
	z := make([]byte, min(n, 1<<20))
	for n > 0 {
		k, err := f.WriteAt(z[:min(int64(len(z)), n)], off)
		if err != nil {
			return err
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
}
