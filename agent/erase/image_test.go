package erase

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

// Disk images the tests erase: partition tables, filesystems and RAID
// superblocks written at the offsets real tools use, so wipefs and blkid
// (where installed) recognise them before the erase.

// linuxFS is the GPT type GUID 0FC63DAF-8483-4772-8E79-3D69D8477DE4 as
// stored (mixed endian).
var linuxFS = []byte{0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4}

func newImage(t testing.TB, size int64) string {
	t.Helper()
	path := t.TempDir() + "/disk.img"
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// writeMBR writes an MBR naming parts (type 0x83).
func writeMBR(t *testing.T, path string, parts []extent) {
	t.Helper()
	mbr := make([]byte, 512)
	for i, p := range parts {
		e := mbr[446+16*i:]
		e[4] = 0x83
		binary.LittleEndian.PutUint32(e[8:], uint32(p.off/512))
		binary.LittleEndian.PutUint32(e[12:], uint32(p.n/512))
	}
	mbr[510], mbr[511] = 0x55, 0xaa
	writeAt(t, path, 0, mbr)
}

// writeGPT writes a protective MBR and primary and backup GPTs (512-byte
// sectors, 128 entries) naming parts.
func writeGPT(t *testing.T, path string, size int64, parts []extent) {
	t.Helper()
	const ss = 512
	last := size/ss - 1
	pmbr := make([]byte, 512)
	pmbr[446+4] = 0xee
	binary.LittleEndian.PutUint32(pmbr[446+8:], 1)
	binary.LittleEndian.PutUint32(pmbr[446+12:], uint32(min(last, 0xffffffff)))
	pmbr[510], pmbr[511] = 0x55, 0xaa
	writeAt(t, path, 0, pmbr)

	entries := make([]byte, 128*128)
	for i, p := range parts {
		e := entries[i*128:]
		copy(e, linuxFS)
		for j := 16; j < 32; j++ {
			e[j] = byte(i*16 + j) // unique GUID
		}
		binary.LittleEndian.PutUint64(e[32:], uint64(p.off/ss))
		binary.LittleEndian.PutUint64(e[40:], uint64((p.off+p.n)/ss-1))
		for j, c := range "part" + string(rune('1'+i)) {
			binary.LittleEndian.PutUint16(e[56+2*j:], uint16(c))
		}
	}
	header := func(my, alt, entriesLBA int64) []byte {
		h := make([]byte, ss)
		copy(h, "EFI PART")
		binary.LittleEndian.PutUint32(h[8:], 0x00010000)
		binary.LittleEndian.PutUint32(h[12:], 92)
		binary.LittleEndian.PutUint64(h[24:], uint64(my))
		binary.LittleEndian.PutUint64(h[32:], uint64(alt))
		binary.LittleEndian.PutUint64(h[40:], 34)
		binary.LittleEndian.PutUint64(h[48:], uint64(last-33))
		copy(h[56:72], "corral-test-disk")
		binary.LittleEndian.PutUint64(h[72:], uint64(entriesLBA))
		binary.LittleEndian.PutUint32(h[80:], 128)
		binary.LittleEndian.PutUint32(h[84:], 128)
		binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
		binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
		return h
	}
	writeAt(t, path, 1*ss, header(1, last, 2))
	writeAt(t, path, 2*ss, entries)
	writeAt(t, path, (last-32)*ss, entries)
	writeAt(t, path, last*ss, header(last, 1, last-32))
}

// mkfsExt4 makes an ext4 filesystem in [off, off+n) of the image.
func mkfsExt4(t testing.TB, path string, off, n int64) {
	t.Helper()
	bin, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		bin = "/usr/sbin/mkfs.ext4"
		require.File(t, bin, "mkfs.ext4 (apt-get install e2fsprogs)")
	}
	out, err := exec.Command(bin, "-q", "-F", "-E", "offset="+itoa(off), path, itoa(n/1024)+"k").CombinedOutput()
	if err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
}

// writeMD1 writes an MD RAID 1.x superblock (valid checksum) at off of a
// member of size bytes starting at base.
func writeMD1(t *testing.T, path string, base, size, off int64) {
	t.Helper()
	const maxDev = 2
	sb := make([]byte, 256+2*maxDev)
	binary.LittleEndian.PutUint32(sb[0:], 0xa92b4efc)
	binary.LittleEndian.PutUint32(sb[4:], 1) // major version
	copy(sb[16:32], "corral-test-set!")
	copy(sb[32:64], "corral:0")
	binary.LittleEndian.PutUint32(sb[72:], 1)                       // level: RAID1
	binary.LittleEndian.PutUint64(sb[80:], uint64((size-mib)/512))  // size
	binary.LittleEndian.PutUint32(sb[92:], 2)                       // raid_disks
	binary.LittleEndian.PutUint64(sb[136:], uint64((size-mib)/512)) // data_size
	binary.LittleEndian.PutUint64(sb[144:], uint64((off-base)/512)) // super_offset
	copy(sb[168:184], "corral-test-dev!")
	binary.LittleEndian.PutUint32(sb[220:], maxDev)
	var sum uint64
	for i := 0; i+4 <= len(sb); i += 4 {
		sum += uint64(binary.LittleEndian.Uint32(sb[i:]))
	}
	binary.LittleEndian.PutUint32(sb[216:], uint32(sum&0xffffffff+sum>>32))
	writeAt(t, path, off, sb)
}

// writeMD090 writes an MD RAID 0.90 superblock at the end of a member of
// size bytes starting at base (64 KiB aligned, 64 KiB from the end).
func writeMD090(t *testing.T, path string, base, size int64) int64 {
	t.Helper()
	off := base + size&^(64*kib-1) - 64*kib
	sb := make([]byte, 4096)
	binary.LittleEndian.PutUint32(sb[0:], 0xa92b4efc)
	binary.LittleEndian.PutUint32(sb[4:], 0)  // major
	binary.LittleEndian.PutUint32(sb[8:], 90) // minor
	binary.LittleEndian.PutUint32(sb[20:], 1) // set_uuid0
	binary.LittleEndian.PutUint32(sb[28:], 1) // level
	binary.LittleEndian.PutUint32(sb[36:], 2) // nr_disks
	binary.LittleEndian.PutUint32(sb[40:], 2) // raid_disks
	writeAt(t, path, off, sb)
	return off
}

// writeLVM writes an LVM2 physical volume label in sector 1.
func writeLVM(t *testing.T, path string, off int64) {
	t.Helper()
	l := make([]byte, 512)
	copy(l, "LABELONE")
	binary.LittleEndian.PutUint64(l[8:], 1)
	binary.LittleEndian.PutUint32(l[20:], 32)
	copy(l[24:], "LVM2 001")
	copy(l[32:], "corraltestpvuuid0123456789abcdef")
	writeAt(t, path, off+512, l)
}

// probe is what wipefs (whole image) or blkid (at an offset) find, or
// "" with ok false when the tool is not installed.
func wipefs(t *testing.T, path string) (string, bool) {
	t.Helper()
	bin, err := exec.LookPath("wipefs")
	if err != nil {
		return "", false
	}
	out, err := exec.Command(bin, "-n", "-p", path).CombinedOutput()
	if err != nil {
		t.Fatalf("wipefs -n %s: %v: %s", path, err, out)
	}
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(line, ","); len(f) >= 4 && !strings.HasPrefix(line, "#") {
			types = append(types, f[3])
		}
	}
	return strings.Join(types, " "), true
}

// blkidAt is the TYPE (or PTTYPE) blkid finds at [off, off+n) of path.
func blkidAt(t *testing.T, path string, off, n int64) (string, bool) {
	t.Helper()
	bin, err := exec.LookPath("blkid")
	if err != nil {
		return "", false
	}
	out, _ := exec.Command(bin, "-p", "-o", "export", "-O", itoa(off), "-S", itoa(n), path).CombinedOutput()
	var types []string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "TYPE="); ok {
			types = append(types, v)
		}
		if v, ok := strings.CutPrefix(line, "PTTYPE="); ok {
			types = append(types, v)
		}
	}
	return strings.Join(types, " "), true
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
