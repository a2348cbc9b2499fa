package kexec

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
)

const testInitSize = 3 << 20

// testBzImage is the start of a 64-bit relocatable bzImage (boot protocol
// 2.15, 4 setup sectors, 2 MiB alignment) with code bytes after it.
func testBzImage(edit func(b []byte)) []byte {
	b := make([]byte, 5*512+64<<10)
	le := binary.LittleEndian
	b[hdrSetupSects] = 4
	b[hdrJump], b[hdrJump+1] = 0xeb, 0x6a // header to 0x26c
	copy(b[hdrMagic:], "HdrS")
	le.PutUint16(b[hdrVersion:], 0x020f)
	le.PutUint32(b[hdrAlign:], 2<<20)
	b[hdrRelocatable] = 1
	le.PutUint16(b[hdrXLoadflags:], xlfKernel64|xlfCanAbove4G)
	le.PutUint32(b[hdrInitSize:], testInitSize)
	for i := 5 * 512; i < len(b); i++ {
		b[i] = byte(i)
	}
	if edit != nil {
		edit(b)
	}
	return b
}

// testZeroPage is this boot's zero page: an ACPI RSDP, EFI info, an E820
// entry and a setup_data pointer.
func testZeroPage() []byte {
	bp := make([]byte, bootParamsSize)
	le := binary.LittleEndian
	le.PutUint64(bp[0x070:], 0xf5a40)
	copy(bp[bpEFIInfo:], "EL64 efi info of the first boot")
	bp[0x1e8] = 1
	le.PutUint64(bp[0x2d0:], 0x100000)
	le.PutUint64(bp[0x2d8:], 1<<30)
	le.PutUint32(bp[0x2e0:], 1)
	le.PutUint64(bp[hdrSetupData:], 0x12345000)
	return bp
}

func testMemoryMap(ramTop uintptr) ukexec.MemoryMap {
	return ukexec.MemoryMap{
		{Range: ukexec.Range{Start: 0x1000, Size: 0x9e000}, Type: ukexec.RangeRAM},
		{Range: ukexec.RangeFromInterval(0x100000, ramTop), Type: ukexec.RangeRAM},
	}
}

// segmentAt is the segment whose physical range holds p.
func segmentAt(t *testing.T, segs ukexec.Segments, p uintptr) ukexec.Segment {
	t.Helper()
	for _, s := range segs {
		if s.Phys.Contains(p) {
			return s
		}
	}
	t.Fatalf("no segment holds %#x: %s", p, segs)
	return ukexec.Segment{}
}

func TestPlanSegments(t *testing.T) {
	le := binary.LittleEndian
	kb := testBzImage(nil)
	initrd := bytes.Repeat([]byte("initramfs"), 100_000)
	const cmdline = "corral.mode=hypervisor console=ttyS0,115200n8"
	segs, entry, err := planSegments(testZeroPage(), testMemoryMap(1<<30), kb, initrd, cmdline, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ukexec.AlignAndMerge(segs); err != nil {
		t.Fatalf("segments overlap: %v", err)
	}
	purg := segmentAt(t, segs, entry)
	kernelAt := uintptr(le.Uint64(purg.Buf[8:])) - entry64Offset
	zpAt := uintptr(le.Uint64(purg.Buf[16:]))
	kernel := segmentAt(t, segs, kernelAt)
	zp := segmentAt(t, segs, zpAt).Buf
	initrdAt := uintptr(le.Uint32(zp[hdrRamdisk:])) | uintptr(le.Uint32(zp[bpExtRamdisk:]))<<32
	cmdAt := uintptr(le.Uint32(zp[hdrCmdline:])) | uintptr(le.Uint32(zp[bpExtCmdline:]))<<32

	type layout struct {
		KernelAligned, KernelAbove16M, KernelIsCode, KernelHasInitSize bool
		Code32Start                                                    uintptr
		Loader                                                         byte
		InitrdOK, CmdlineOK                                            bool
		HeaderFromKernel, EFIInfoCleared                               bool
		RSDP, E820Addr, SetupData                                      uint64
		E820Entries                                                    byte
	}
	got := layout{
		KernelAligned:     kernel.Phys.Start%(2<<20) == 0,
		KernelAbove16M:    kernel.Phys.Start >= minKernelAddr,
		KernelIsCode:      bytes.Equal(kernel.Buf, kb[5*512:]),
		KernelHasInitSize: kernel.Phys.Size >= testInitSize,
		Code32Start:       uintptr(le.Uint32(zp[hdrCode32Start:])),
		Loader:            zp[hdrLoader],
		InitrdOK: bytes.Equal(segmentAt(t, segs, initrdAt).Buf, initrd) &&
			le.Uint32(zp[hdrRamdisk+4:]) == uint32(len(initrd)),
		CmdlineOK:        string(segmentAt(t, segs, cmdAt).Buf) == cmdline+"\x00",
		HeaderFromKernel: bytes.Equal(zp[hdrMagic:hdrMagic+4], []byte("HdrS")) && le.Uint32(zp[hdrInitSize:]) == testInitSize,
		EFIInfoCleared:   bytes.Equal(zp[bpEFIInfo:bpEFIInfo+32], make([]byte, 32)),
		RSDP:             le.Uint64(zp[0x070:]),
		E820Entries:      zp[0x1e8],
		E820Addr:         le.Uint64(zp[0x2d0:]),
		SetupData:        le.Uint64(zp[hdrSetupData:]),
	}
	want := layout{
		KernelAligned: true, KernelAbove16M: true, KernelIsCode: true, KernelHasInitSize: true,
		Code32Start: kernelAt, Loader: loaderKexec, InitrdOK: true, CmdlineOK: true,
		HeaderFromKernel: true, EFIInfoCleared: true,
		RSDP: 0xf5a40, E820Entries: 1, E820Addr: 0x100000, SetupData: 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layout (-want +got):\n%s", diff)
	}
}

func TestPlanSegmentsRefuses(t *testing.T) {
	le := binary.LittleEndian
	for _, tc := range []struct {
		name   string
		bp     []byte
		ramTop uintptr
		// ramFrom: RAM from 1 MiB is reserved below this (0: none)
		ramFrom uintptr
		edit    func(b []byte)
		want    string
	}{
		{name: "not a bzImage", edit: func(b []byte) { copy(b[hdrMagic:], "MZ\x00\x00") }, want: "not a bzImage"},
		{name: "old boot protocol", edit: func(b []byte) { le.PutUint16(b[hdrVersion:], 0x020b) }, want: "boot protocol 0x20b"},
		{name: "no 64-bit entry", edit: func(b []byte) { b[hdrXLoadflags] = 0 }, want: "no relocatable 64-bit entry"},
		{name: "not relocatable", edit: func(b []byte) { b[hdrRelocatable] = 0 }, want: "no relocatable 64-bit entry"},
		{name: "bad alignment", edit: func(b []byte) { le.PutUint32(b[hdrAlign:], 3000) }, want: "kernel_alignment"},
		{name: "setup past the file", edit: func(b []byte) { b[hdrSetupSects] = 255 }, want: "setup of 255 sectors"},
		{name: "short zero page", bp: make([]byte, 512), want: "zero page of 512 bytes"},
		{name: "no E820 table", bp: func() []byte { bp := testZeroPage(); bp[bpE820Entries] = 0; return bp }(), want: "0 E820 entries"},
		{name: "E820 table continued in setup_data", bp: func() []byte { bp := testZeroPage(); bp[bpE820Entries] = 128; return bp }(), want: "128 E820 entries"},
		{name: "kernel only above 4 GiB", ramTop: 6 << 30, ramFrom: 1<<32 - 2<<20, want: "below 4 GiB"},
		{name: "no room for the kernel", ramTop: 18 << 20, want: "no room for the kernel"},
		{name: "no room for the initrd", ramTop: 20 << 20, want: "no room for the initrd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bp := tc.bp
			if bp == nil {
				bp = testZeroPage()
			}
			top := tc.ramTop
			if top == 0 {
				top = 1 << 30
			}
			mm := testMemoryMap(top)
			if tc.ramFrom != 0 {
				mm[1].Range = ukexec.RangeFromInterval(tc.ramFrom, top)
			}
			_, _, err := planSegments(bp, mm, testBzImage(tc.edit), bytes.Repeat([]byte("i"), 4<<20), "quiet", nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestPageSegments: planSegments' layout goes to kexec_load(2) as u-root's
// AlignAndMerge would hand it (same physical ranges, same bytes) but with
// the segments' own buffers, not copies; any other layout is left to
// u-root.
func TestPageSegments(t *testing.T) {
	kb := testBzImage(nil)
	initrd := bytes.Repeat([]byte("initramfs"), 100_000)
	segs, entry, err := planSegments(testZeroPage(), testMemoryMap(1<<30), kb, initrd, "console=ttyS0", nil)
	if err != nil {
		t.Fatal(err)
	}
	ks, ok := pageSegments(entry, segs)
	if !ok {
		t.Fatalf("planSegments' layout refused: %s", segs)
	}
	merged, err := ukexec.AlignAndMerge(slices.Clone(segs))
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != len(merged) {
		t.Fatalf("%d segments, u-root makes %d", len(ks), len(merged))
	}
	own := map[uintptr][]byte{}
	for _, s := range segs {
		own[uintptr(unsafe.Pointer(&s.Buf[0]))] = s.Buf
	}
	for i, k := range ks {
		m := merged[i]
		if k.mem != m.Phys.Start || k.memsz != m.Phys.Size {
			t.Errorf("segment %d at %#x+%#x, u-root: %#x+%#x", i, k.mem, k.memsz, m.Phys.Start, m.Phys.Size)
		}
		b, ok := own[k.buf]
		if !ok {
			t.Errorf("segment %d at %#x: a copy, not the planned buffer", i, k.mem)
			continue
		}
		if got := b[:k.bufsz]; !bytes.Equal(got, m.Buf) {
			t.Errorf("segment %d at %#x: %d bytes differ from u-root's %d", i, k.mem, k.bufsz, len(m.Buf))
		}
	}

	seg := func(start uintptr, size uint) ukexec.Segment {
		return ukexec.NewSegment(make([]byte, size), ukexec.Range{Start: start, Size: size})
	}
	for name, tc := range map[string]struct {
		entry uintptr
		segs  ukexec.Segments
	}{
		"unaligned start":        {0x1000, ukexec.Segments{seg(0x1000, 10), seg(0x3004, 10)}},
		"overlap after rounding": {0x1000, ukexec.Segments{seg(0x1000, 0x1001), seg(0x2000, 10)}},
		"entry outside":          {0x9000, ukexec.Segments{seg(0x1000, 10)}},
		"buffer over the range":  {0x1000, ukexec.Segments{{Buf: make([]byte, 20), Phys: ukexec.Range{Start: 0x1000, Size: 10}}}},
		"none":                   {0x1000, nil},
	} {
		if _, ok := pageSegments(tc.entry, tc.segs); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}
