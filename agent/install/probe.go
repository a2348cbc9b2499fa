package install

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Contents is what Probe found on a disk.
type Contents struct {
	// Found describes each signature for a person: "a GPT with 2
	// partitions", "an ext4 filesystem". Empty means the disk looks blank.
	Found []string
	// GPT holds the used partitions of a valid GPT (nil without one).
	GPT []GPTPartition
}

// Blank reports whether no signature was found.
func (c Contents) Blank() bool { return len(c.Found) == 0 }

// corralPartition returns the disk's data partition when the disk holds a
// valid GPT whose only partition is named PartitionName.
func (c Contents) corralPartition() (GPTPartition, bool) {
	if len(c.GPT) == 1 && c.GPT[0].Name == PartitionName {
		return c.GPT[0], true
	}
	return GPTPartition{}, false
}

func (c Contents) String() string { return strings.Join(c.Found, " and ") }

// probeWindow is how much of each end of a disk Probe reads (and Wipe
// zeroes): it covers MBR, GPT, and the superblocks of ext2/3/4, XFS,
// btrfs, LVM, MD RAID 1.x, swap, LUKS, ISO 9660, FAT and NTFS.
const probeWindow = 1 << 20

// Probe reads the partition tables and filesystem signatures at both ends
// of the disk (or image) at path, size bytes with sectorSize-byte sectors.
func Probe(path string, size int64, sectorSize int) (Contents, error) {
	f, err := os.Open(path)
	if err != nil {
		return Contents{}, fmt.Errorf("install: %w", err)
	}
	defer f.Close()
	ss := int64(sectorSize)
	head := make([]byte, min(size, probeWindow))
	if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return Contents{}, fmt.Errorf("install: read %s: %w", path, err)
	}
	var c Contents
	at := func(off int, magic string) bool {
		return off+len(magic) <= len(head) && string(head[off:off+len(magic)]) == magic
	}

	// Partition tables.
	gptFound := false
	if parts, err := readGPT(f, ss, 1); err == nil {
		c.GPT, gptFound = parts, true
		c.Found = append(c.Found, fmt.Sprintf("a GPT with %d partition%s%s", len(parts), plural(len(parts)), names(parts)))
	} else if !errors.Is(err, errNoGPT) {
		c.Found = append(c.Found, fmt.Sprintf("a damaged GPT (%v)", err))
		gptFound = true
	} else if size >= 2*ss {
		// Primary gone, backup (last sector) left.
		if parts, err := readGPT(f, ss, uint64(size/ss)-1); err == nil {
			c.Found = append(c.Found, fmt.Sprintf("a backup GPT with %d partition%s", len(parts), plural(len(parts))))
			gptFound = true
		}
	}
	if !gptFound && len(head) >= 512 && head[510] == 0x55 && head[511] == 0xAA {
		switch {
		case at(82, "FAT32") || at(54, "FAT1"):
			c.Found = append(c.Found, "a FAT filesystem")
		case at(3, "NTFS    "):
			c.Found = append(c.Found, "an NTFS filesystem")
		default:
			n := 0
			for i := range 4 {
				if head[446+16*i+4] != 0 {
					n++
				}
			}
			c.Found = append(c.Found, fmt.Sprintf("an MBR partition table with %d partition%s", n, plural(n)))
		}
	}

	// Filesystems and volume managers on the whole disk.
	switch {
	case len(head) >= 1082 && binary.LittleEndian.Uint16(head[1080:]) == 0xEF53:
		c.Found = append(c.Found, "an "+extKind(head[1024:])+" filesystem")
	case at(0, "XFSB"):
		c.Found = append(c.Found, "an XFS filesystem")
	case at(65536+64, "_BHRfS_M"):
		c.Found = append(c.Found, "a btrfs filesystem")
	case at(0, "LUKS\xba\xbe"):
		c.Found = append(c.Found, "a LUKS volume")
	case at(4086, "SWAPSPACE2") || at(4086, "SWAP-SPACE"):
		c.Found = append(c.Found, "a swap area")
	case at(32769, "CD001"):
		c.Found = append(c.Found, "an ISO 9660 filesystem")
	case len(head) >= 4100 && binary.LittleEndian.Uint32(head[4096:]) == 0xa92b4efc:
		c.Found = append(c.Found, "an MD RAID member")
	}
	for i := range 4 {
		if at(512*i, "LABELONE") {
			c.Found = append(c.Found, "an LVM physical volume")
			break
		}
	}
	return c, nil
}

// extKind tells ext2, ext3 and ext4 apart from the superblock's feature
// flags.
func extKind(sb []byte) string {
	compat := binary.LittleEndian.Uint32(sb[0x5C:])
	incompat := binary.LittleEndian.Uint32(sb[0x60:])
	switch {
	case incompat&0x2C0 != 0: // extents, 64bit, flex_bg
		return "ext4"
	case compat&0x4 != 0: // has_journal
		return "ext3"
	}
	return "ext2"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func names(parts []GPTPartition) string {
	var ns []string
	for _, p := range parts {
		if p.Name != "" {
			ns = append(ns, fmt.Sprintf("%q", p.Name))
		}
	}
	if len(ns) == 0 {
		return ""
	}
	return " (" + strings.Join(ns, ", ") + ")"
}

// wipeRegions zeroes the first and last probeWindow bytes of the disk (or
// image) at path: partition tables (MBR, both GPTs) and the signatures
// Probe knows. It syncs before returning.
func wipeRegions(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer f.Close()
	zero := make([]byte, min(size, probeWindow))
	if _, err := f.WriteAt(zero, 0); err != nil {
		return fmt.Errorf("install: wipe start of %s: %w", path, err)
	}
	if size > int64(len(zero)) {
		if _, err := f.WriteAt(zero, size-int64(len(zero))); err != nil {
			return fmt.Errorf("install: wipe end of %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("install: sync %s: %w", path, err)
	}
	return f.Close()
}
