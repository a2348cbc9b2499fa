package kexec

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"unsafe"

	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
	"github.com/u-root/u-root/pkg/boot/purgatory"
	"golang.org/x/sys/unix"
)

// x86 boot protocol (Documentation/arch/x86/boot.rst, zero-page.rst):
// offsets in the bzImage's first sector and in struct boot_params.
const (
	bpExtRamdisk    = 0x0c0 // ext_ramdisk_image (u32), ext_ramdisk_size at +4
	bpExtCmdline    = 0x0c8 // ext_cmd_line_ptr (u32)
	bpEFIInfo       = 0x1c0 // efi_info (32 bytes)
	bpE820Entries   = 0x1e8 // e820_entries (u8); the table is at 0x2d0
	e820MaxZeroPage = 128
	bpHdr           = 0x1f1 // struct setup_header
	hdrSetupSects   = 0x1f1
	hdrJump         = 0x200 // the header's end is 0x202 + the byte at 0x201
	hdrMagic        = 0x202 // "HdrS"
	hdrVersion      = 0x206
	hdrLoader       = 0x210 // type_of_loader
	hdrLoadflags    = 0x211
	hdrCode32Start  = 0x214
	hdrRamdisk      = 0x218 // ramdisk_image, ramdisk_size at +4
	hdrCmdline      = 0x228 // cmd_line_ptr
	hdrInitrdMax    = 0x22c // initrd_addr_max
	hdrAlign        = 0x230 // kernel_alignment
	hdrRelocatable  = 0x234
	hdrXLoadflags   = 0x236
	hdrCmdlineSize  = 0x238
	hdrSetupData    = 0x250 // u64
	hdrInitSize     = 0x260
	bootParamsSize  = 4096

	loaderKexec   = 0x0d // type_of_loader: kexec-tools
	xlfKernel64   = 1 << 0
	xlfCanAbove4G = 1 << 1
	entry64Offset = 0x200 // startup_64 from the protected-mode code's start
	minKernelAddr = 16 << 20
)

// ErrEFI means this boot's EFI runtime cannot be handed over (no
// /sys/firmware/efi/runtime-map): use kexec_file_load.
var ErrEFI = errors.New("EFI runtime map not available: kexec_load path not used")

// SegmentsLoad loads a 64-bit bzImage, initrd and command line for the
// next kexec reboot with kexec_load(2): the kernel's own decompressor is
// entered at its 64-bit entry point, through u-root's purgatory, which only
// sets up the registers and jumps. Unlike kexec_file_load(2) nothing hashes
// the segments (at load, and again in the purgatory before the jump):
// under QEMU TCG that costs seconds per boot, and the agent has verified
// size and SHA-256 of both files already. The zero page is this boot's
// (/sys/kernel/boot_params/data: its E820 map and ACPI RSDP) with the new
// kernel's setup header. On a machine booted by EFI it hands the EFI
// runtime over as kexec_file_load does (efiState); without the runtime map
// it refuses (ErrEFI).
func SegmentsLoad(kernel, initrd *os.File, cmdline string) error {
	var efi *efiState
	if _, err := os.Stat(efiDir); err == nil {
		if efi, err = readEFIState(efiDir); err != nil {
			return fmt.Errorf("%w: %v", ErrEFI, err)
		}
	}
	bp, err := os.ReadFile("/sys/kernel/boot_params/data")
	if err != nil {
		return fmt.Errorf("kexec_load: zero page: %w", err)
	}
	mm, err := ukexec.MemoryMapFromSysfsMemmap()
	if err != nil {
		return fmt.Errorf("kexec_load: memory map: %w", err)
	}
	kb, release, err := readAll(kernel)
	if err != nil {
		return fmt.Errorf("kexec_load: kernel: %w", err)
	}
	defer release()
	ib, release, err := readAll(initrd)
	if err != nil {
		return fmt.Errorf("kexec_load: initrd: %w", err)
	}
	defer release()
	segs, entry, err := planSegments(bp, mm, kb, ib, cmdline, efi)
	if err != nil {
		return fmt.Errorf("kexec_load: %w", err)
	}
	if err := loadSegments(entry, segs); err != nil {
		return fmt.Errorf("kexec_load: %w", err)
	}
	return nil
}

// kexecSegment is struct kexec_segment of kexec_load(2).
type kexecSegment struct {
	buf   uintptr
	bufsz uint
	mem   uintptr
	memsz uint
}

// loadSegments hands segs to kexec_load(2) without copying them. u-root's
// ukexec.Load first copies every buffer (AlignAndMerge → AlignPhysStart
// appends it to a new slice even when its start is aligned already): the
// 47 MB of kernel and initrd once more, 0.4-1.2 s under QEMU TCG, before
// the kernel copies them again. planSegments lays every segment out at a
// page-aligned start, so only the sizes need rounding up, which is what
// pageSegments does; any other layout goes through ukexec.Load.
func loadSegments(entry uintptr, segs ukexec.Segments) error {
	ks, ok := pageSegments(entry, segs)
	if !ok {
		return ukexec.Load(entry, segs, 0)
	}
	_, _, errno := unix.Syscall6(unix.SYS_KEXEC_LOAD, entry, uintptr(len(ks)), uintptr(unsafe.Pointer(&ks[0])), 0, 0, 0)
	runtime.KeepAlive(segs)
	if errno != 0 {
		return fmt.Errorf("kexec_load(entry %#x, %d segments): %w", entry, len(ks), errno)
	}
	return nil
}

// pageSegments is segs as kexec_load(2) takes them, each buffer the
// segment's own (not copied), when every physical start is page aligned,
// no two overlap once their sizes are rounded up to pages, and entry lies
// in one; ok is false otherwise.
func pageSegments(entry uintptr, segs ukexec.Segments) (ks []kexecSegment, ok bool) {
	const page = 4096
	if len(segs) == 0 || len(segs) > 16 { // KEXEC_SEGMENT_MAX
		return nil, false
	}
	sorted := slices.Clone(segs)
	slices.SortFunc(sorted, func(a, b ukexec.Segment) int { return cmp.Compare(a.Phys.Start, b.Phys.Start) })
	inEntry := false
	for i, s := range sorted {
		size := (s.Phys.Size + page - 1) &^ (page - 1)
		if s.Phys.Start%page != 0 || size == 0 || uint(len(s.Buf)) > s.Phys.Size {
			return nil, false
		}
		if i > 0 && sorted[i-1].Phys.Start+uintptr(ks[i-1].memsz) > s.Phys.Start {
			return nil, false
		}
		k := kexecSegment{mem: s.Phys.Start, memsz: size}
		if len(s.Buf) > 0 {
			k.buf, k.bufsz = uintptr(unsafe.Pointer(&s.Buf[0])), uint(len(s.Buf))
		}
		ks = append(ks, k)
		inEntry = inEntry || (entry >= s.Phys.Start && entry < s.Phys.Start+uintptr(size))
	}
	return ks, inEntry
}

// planSegments lays out the kexec segments of a bzImage (kb), initrd (ib)
// and cmdline in the RAM of mm, with zero page template bp, and returns
// them with the purgatory's entry point.
func planSegments(bp []byte, mm ukexec.MemoryMap, kb, ib []byte, cmdline string, efi *efiState) (ukexec.Segments, uintptr, error) {
	if len(bp) < bootParamsSize {
		return nil, 0, fmt.Errorf("zero page of %d bytes, want %d", len(bp), bootParamsSize)
	}
	// A full E820 table in the zero page means more entries came in
	// setup_data (SETUP_E820_EXT), which is not handed over.
	if n := bp[bpE820Entries]; n == 0 || n >= e820MaxZeroPage {
		return nil, 0, fmt.Errorf("zero page holds %d E820 entries: want 1 to %d", n, e820MaxZeroPage-1)
	}
	if len(kb) < 0x300 || string(kb[hdrMagic:hdrMagic+4]) != "HdrS" {
		return nil, 0, errors.New("kernel is not a bzImage (no HdrS header)")
	}
	le := binary.LittleEndian
	if v := le.Uint16(kb[hdrVersion:]); v < 0x020c {
		return nil, 0, fmt.Errorf("kernel boot protocol %#x, want 2.12 or later", v)
	}
	if kb[hdrXLoadflags]&xlfKernel64 == 0 || kb[hdrRelocatable] == 0 {
		return nil, 0, errors.New("kernel has no relocatable 64-bit entry point")
	}
	sects := int(kb[hdrSetupSects])
	if sects == 0 {
		sects = 4
	}
	codeOff := (sects + 1) * 512
	hdrEnd := hdrJump + 2 + int(kb[hdrJump+1])
	if codeOff >= len(kb) || hdrEnd > codeOff || hdrEnd > bootParamsSize {
		return nil, 0, fmt.Errorf("bzImage: setup of %d sectors, header to %#x, file %d bytes", sects, hdrEnd, len(kb))
	}
	code := kb[codeOff:]
	initSize := uint(le.Uint32(kb[hdrInitSize:]))
	align := uint(le.Uint32(kb[hdrAlign:]))
	if align < 4096 || align&(align-1) != 0 {
		return nil, 0, fmt.Errorf("bzImage: kernel_alignment %#x", align)
	}
	if initSize < uint(len(code)) {
		initSize = uint(len(code))
	}
	kmem := &ukexec.Memory{Phys: mm}
	ram := kmem.AvailableRAM()
	kr, err := ram.FindSpace(initSize, ukexec.WithStartAlignment(align), ukexec.WithMinimumAddr(minKernelAddr))
	if err != nil {
		return nil, 0, fmt.Errorf("no room for the kernel (%d bytes): %w", initSize, err)
	}
	kr.Size = initSize
	if kr.End() > 1<<32 {
		return nil, 0, fmt.Errorf("no room for the kernel (%d bytes) below 4 GiB", initSize)
	}
	kmem.Segments.Insert(ukexec.NewSegment(code, kr))
	// initrd, command line and zero page below 4 GiB (any kernel reads
	// their 32-bit fields), above the kernel's minimum.
	low := ukexec.RangeFromInterval(minKernelAddr, 1<<32)
	ir, err := kmem.AddPhysSegment(ib, low)
	if err != nil {
		return nil, 0, fmt.Errorf("no room for the initrd (%d bytes): %w", len(ib), err)
	}
	cr, err := kmem.AddPhysSegment(append([]byte(cmdline), 0), low)
	if err != nil {
		return nil, 0, fmt.Errorf("no room for the command line: %w", err)
	}
	zp := make([]byte, bootParamsSize)
	copy(zp, bp[:bootParamsSize])
	copy(zp[bpHdr:hdrEnd], kb[bpHdr:hdrEnd])
	clear(zp[bpEFIInfo : bpEFIInfo+32])
	le.PutUint64(zp[hdrSetupData:], 0)
	zp[hdrLoader] = loaderKexec
	zp[hdrLoadflags] |= 0x01 // LOADED_HIGH
	le.PutUint32(zp[hdrCode32Start:], uint32(kr.Start))
	le.PutUint32(zp[hdrRamdisk:], uint32(ir.Start))
	le.PutUint32(zp[hdrRamdisk+4:], uint32(len(ib)))
	le.PutUint32(zp[bpExtRamdisk:], uint32(uint64(ir.Start)>>32))
	le.PutUint32(zp[bpExtRamdisk+4:], uint32(uint64(len(ib))>>32))
	le.PutUint32(zp[hdrCmdline:], uint32(cr.Start))
	le.PutUint32(zp[bpExtCmdline:], uint32(uint64(cr.Start)>>32))
	if efi != nil {
		if err := efi.handOver(kmem, zp, bp, low); err != nil {
			return nil, 0, err
		}
	}
	zr, err := kmem.AddPhysSegment(zp, low)
	if err != nil {
		return nil, 0, fmt.Errorf("no room for the zero page: %w", err)
	}
	entry, err := loadPurgatory(kmem, kr.Start+entry64Offset, zr.Start)
	if err != nil {
		return nil, 0, fmt.Errorf("purgatory: %w", err)
	}
	return kmem.Segments, entry, nil
}

// loadPurgatory adds u-root's "default" purgatory (64-bit: sets RSI to
// rsi, jumps to entry; it hashes nothing) to kmem at the address it is
// linked for, and returns its entry point. u-root's purgatory.Load does
// the same but logs the whole ELF header to the standard logger, i.e. the
// agent's console.
func loadPurgatory(kmem *ukexec.Memory, entry, rsi uintptr) (uintptr, error) {
	p, ok := purgatory.Purgatories["default"]
	if !ok {
		return 0, errors.New("u-root has no default purgatory")
	}
	f, err := elf.NewFile(bytes.NewReader(p.Code))
	if err != nil {
		return 0, err
	}
	if len(f.Progs) != 1 {
		return 0, fmt.Errorf("%d program headers, want 1", len(f.Progs))
	}
	ph := f.Progs[0]
	size := (ph.Memsz + 4095) &^ 4095
	if ph.Filesz > ph.Memsz || size < 24 || size > 1<<20 {
		return 0, fmt.Errorf("program header of %d/%d bytes", ph.Filesz, ph.Memsz)
	}
	b := make([]byte, size)
	if _, err := ph.ReadAt(b[:ph.Filesz], 0); err != nil {
		return 0, err
	}
	// The purgatory's first words, after a jump: where to go, and RSI.
	binary.LittleEndian.PutUint64(b[8:], uint64(entry))
	binary.LittleEndian.PutUint64(b[16:], uint64(rsi))
	at := uintptr(ph.Vaddr)
	r, err := kmem.ReservePhys(uint(size), ukexec.RangeFromInterval(at, at+uintptr(size)))
	if err != nil {
		return 0, fmt.Errorf("%d bytes at %#x: %w", size, at, err)
	}
	kmem.Segments.Insert(ukexec.NewSegment(b, r))
	return uintptr(f.Entry), nil
}

// readAll maps f (a memfd) or reads it whole from its start; release
// unmaps.
func readAll(f *os.File) (b []byte, release func(), err error) {
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if st.Size() > 0 && st.Size() <= MaxFileSize {
		if b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE); err == nil {
			// Unmapping a private read-only mapping can fail only on a bad
			// address, which this one is not; nothing would be written.
			return b, func() { _ = unix.Munmap(b) }, nil
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, nil, err
	}
	b, err = io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err == nil && len(b) > MaxFileSize {
		err = fmt.Errorf("over %d bytes", MaxFileSize)
	}
	return b, func() {}, err
}
