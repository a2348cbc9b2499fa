package install

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"unicode/utf16"

	"github.com/u-root/u-root/pkg/mount/gpt"
)

// PartitionName is the GPT partition name (and ext4 label) of the node's
// data partition; agent/hvboot finds the partition by it.
const PartitionName = "corral-data"

// linuxFilesystem is the GPT partition type GUID for Linux filesystem data,
// 0FC63DAF-8483-4772-8E79-3D69D8477DE4.
var linuxFilesystem = gpt.GUID{L: 0x0FC63DAF, W1: 0x8483, W2: 0x4772, B: [8]byte{0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4}}

const (
	gptEntries   = 128
	gptEntrySize = 128
	alignment    = 1 << 20 // first partition starts at 1 MiB
)

// GPTPartition is one used entry of a GPT.
type GPTPartition struct {
	Number            int // 1-based
	Name              string
	FirstLBA, LastLBA uint64
}

// scaledWriter lets u-root's gpt.Write, which addresses 512-byte blocks,
// write a disk with larger logical sectors: every write it makes starts
// on a 512-byte block boundary (MBR, header, entry array), so block n
// becomes sector n.
type scaledWriter struct {
	w  io.WriterAt
	ss int64
}

func (s scaledWriter) WriteAt(p []byte, off int64) (int, error) {
	return s.w.WriteAt(p, off/gpt.BlockSize*s.ss+off%gpt.BlockSize)
}

// WriteGPT writes a protective MBR and primary and backup GPTs to the disk
// (or image) at path, size bytes with sectorSize-byte sectors, holding one
// partition named PartitionName from 1 MiB to the last usable sector. It
// syncs the file before returning.
func WriteGPT(path string, size int64, sectorSize int) error {
	return writeTable(path, size, sectorSize, func(first, last uint64) []partSpec {
		return []partSpec{{PartitionName, first, last}}
	})
}

// partSpec is a partition to write: name and inclusive sector range.
type partSpec struct {
	name        string
	first, last uint64
}

// writeTable writes a GPT whose partitions layout returns given the first
// aligned and the last usable sector.
func writeTable(path string, size int64, sectorSize int, layout func(first, last uint64) []partSpec) error {
	ss := int64(sectorSize)
	if ss < gpt.BlockSize || ss%gpt.BlockSize != 0 {
		return fmt.Errorf("install: sector size %d not supported", sectorSize)
	}
	sectors := uint64(size / ss)
	entrySectors := uint64(gptEntries * gptEntrySize / ss)
	first := uint64(alignment / ss)
	if sectors < first+2*entrySectors+8 {
		return fmt.Errorf("install: disk of %d bytes is too small", size)
	}
	lastUsable := sectors - 2 - entrySectors
	diskGUID, err := randomGUID()
	if err != nil {
		return err
	}
	parts := make([]gpt.Part, gptEntries)
	for i, p := range layout(first, lastUsable) {
		g, err := randomGUID()
		if err != nil {
			return err
		}
		parts[i] = gpt.Part{PartGUID: linuxFilesystem, UniqueGUID: g, FirstLBA: p.first, LastLBA: p.last}
		copy(parts[i].Name[:], utf16le(p.name))
	}
	header := gpt.Header{
		Signature: gpt.Signature, Revision: gpt.Revision, HeaderSize: gpt.HeaderSize,
		CurrentLBA: 1, BackupLBA: sectors - 1, FirstLBA: 2 + entrySectors, LastLBA: lastUsable,
		DiskGUID: diskGUID, PartStart: 2, NPart: gptEntries, PartSize: gptEntrySize,
	}
	backup := header
	backup.CurrentLBA, backup.BackupLBA, backup.PartStart = sectors-1, 1, sectors-1-entrySectors
	backupParts := append([]gpt.Part(nil), parts...)

	var mbr gpt.MBR
	// One protective partition of type 0xEE over the whole disk.
	e := mbr[446:462]
	e[1], e[2], e[3] = 0x00, 0x02, 0x00 // CHS start 0/0/2
	e[4] = 0xEE
	e[5], e[6], e[7] = 0xFF, 0xFF, 0xFF
	binary.LittleEndian.PutUint32(e[8:], 1)
	binary.LittleEndian.PutUint32(e[12:], uint32(min(sectors-1, 0xFFFFFFFF)))
	mbr[510], mbr[511] = 0x55, 0xAA

	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer f.Close()
	table := &gpt.PartitionTable{
		MasterBootRecord: &mbr,
		Primary:          &gpt.GPT{Header: header, Parts: parts},
		Backup:           &gpt.GPT{Header: backup, Parts: backupParts},
	}
	if err := gpt.Write(scaledWriter{f, ss}, table); err != nil {
		return fmt.Errorf("install: write GPT to %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("install: sync %s: %w", path, err)
	}
	return f.Close()
}

// errNoGPT: the disk has no (valid) GPT at the given header.
var errNoGPT = errors.New("no GPT")

// readGPT reads the GPT whose header is at sector lba and returns its used
// partitions. It checks the signature and both CRCs.
func readGPT(r io.ReaderAt, ss int64, lba uint64) ([]GPTPartition, error) {
	hdr := make([]byte, gpt.HeaderSize)
	if _, err := r.ReadAt(hdr, int64(lba)*ss); err != nil {
		return nil, err
	}
	var h gpt.Header
	if err := binary.Read(bytes.NewReader(hdr), binary.LittleEndian, &h); err != nil {
		return nil, err
	}
	if h.Signature != gpt.Signature {
		return nil, errNoGPT
	}
	crc := h.CRC
	copy(hdr[16:20], []byte{0, 0, 0, 0})
	if h.HeaderSize != gpt.HeaderSize || crc32.ChecksumIEEE(hdr) != crc {
		return nil, errors.New("GPT header checksum mismatch")
	}
	if h.NPart > 1024 || h.PartSize < gptEntrySize || h.PartSize > 4096 {
		return nil, fmt.Errorf("GPT with %d entries of %d bytes", h.NPart, h.PartSize)
	}
	arr := make([]byte, int(h.NPart)*int(h.PartSize))
	if _, err := r.ReadAt(arr, int64(h.PartStart)*ss); err != nil {
		return nil, err
	}
	if crc32.ChecksumIEEE(arr) != h.PartCRC {
		return nil, errors.New("GPT partition array checksum mismatch")
	}
	var out []GPTPartition
	for i := range int(h.NPart) {
		var p gpt.Part
		if err := binary.Read(bytes.NewReader(arr[i*int(h.PartSize):]), binary.LittleEndian, &p); err != nil {
			return nil, err
		}
		if p.PartGUID == (gpt.GUID{}) {
			continue
		}
		out = append(out, GPTPartition{Number: i + 1, Name: decodeName(p.Name), FirstLBA: p.FirstLBA, LastLBA: p.LastLBA})
	}
	return out, nil
}

func utf16le(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = binary.LittleEndian.AppendUint16(b, u)
	}
	return b
}

func decodeName(n gpt.PartName) string {
	u := make([]uint16, 0, len(n)/2)
	for i := 0; i+1 < len(n); i += 2 {
		c := binary.LittleEndian.Uint16(n[i:])
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}

// randomGUID is a version-4 GUID in GPT's mixed-endian layout.
func randomGUID() (gpt.GUID, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return gpt.GUID{}, err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	g := gpt.GUID{
		L: binary.BigEndian.Uint32(b[0:]), W1: binary.BigEndian.Uint16(b[4:]), W2: binary.BigEndian.Uint16(b[6:]),
	}
	copy(g.B[:], b[8:])
	return g, nil
}
