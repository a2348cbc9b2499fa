package kexec

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeEFI writes a /sys/firmware/efi as Linux shows it (two runtime map
// entries) under a temporary directory and returns it.
func fakeEFI(t *testing.T, withMap bool) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"fw_vendor":    "0x9f7e0018\n",
		"config_table": "0x9f7ee018\n",
		"systab":       "ACPI20=0x9f77d014\nACPI=0x9f77d000\nSMBIOS=0x9f520000\n",
	}
	if withMap {
		for i, e := range []map[string]string{
			{"type": "0x5", "phys_addr": "0x9f600000", "virt_addr": "0xfffffffeffc00000", "num_pages": "0x20", "attribute": "0x800000000000000f"},
			{"type": "0x6", "phys_addr": "0x9f700000", "virt_addr": "0xfffffffeffb00000", "num_pages": "0x10", "attribute": "0x800000000000000f"},
		} {
			for k, v := range e {
				files[filepath.Join("runtime-map", string(rune('0'+i)), k)] = v + "\n"
			}
		}
	}
	for name, v := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestEFIHandOver(t *testing.T) {
	le := binary.LittleEndian
	st, err := readEFIState(fakeEFI(t, true))
	if err != nil {
		t.Fatal(err)
	}
	bp := testZeroPage()
	cur := bp[bpEFIInfo:]
	clear(cur[:32])
	copy(cur[eiSignature:], "EL64")
	le.PutUint32(cur[eiSystab:], 0x9f7ef018)
	le.PutUint32(cur[eiDescSize:], 48)
	le.PutUint32(cur[eiDescVersion:], 1)
	le.PutUint32(cur[eiMemmap:], 0x1234000) // the stub's map: gone after the boot
	le.PutUint32(cur[eiMemmapSize:], 48*90)
	bp[bpSecureBoot] = 3

	segs, entry, err := planSegments(bp, testMemoryMap(1<<30), testBzImage(nil), []byte("initramfs"), "quiet", st)
	if err != nil {
		t.Fatal(err)
	}
	zp := segmentAt(t, segs, uintptr(le.Uint64(segmentAt(t, segs, entry).Buf[16:]))).Buf
	ei := zp[bpEFIInfo:]
	sdAt := uintptr(le.Uint64(zp[hdrSetupData:]))
	sd := segmentAt(t, segs, sdAt).Buf
	mapAt := uintptr(le.Uint32(ei[eiMemmap:])) | uintptr(le.Uint32(ei[eiMemmapHi:]))<<32
	mapSize := int(le.Uint32(ei[eiMemmapSize:]))

	type desc struct {
		Type                    uint32
		Phys, Virt, Pages, Attr uint64
	}
	type handover struct {
		Signature                     string
		Systab, DescSize, DescVersion uint32
		SecureBoot                    byte
		Next                          uint64
		SetupType, SetupLen           uint32
		FWVendor, Tables, SMBIOS      uint64
		MapInSetupPage                bool
		Map                           []desc
	}
	got := handover{
		Signature:      string(ei[eiSignature : eiSignature+4]),
		Systab:         le.Uint32(ei[eiSystab:]),
		DescSize:       le.Uint32(ei[eiDescSize:]),
		DescVersion:    le.Uint32(ei[eiDescVersion:]),
		SecureBoot:     zp[bpSecureBoot],
		Next:           le.Uint64(sd[0:]),
		SetupType:      le.Uint32(sd[8:]),
		SetupLen:       le.Uint32(sd[12:]),
		FWVendor:       le.Uint64(sd[16:]),
		Tables:         le.Uint64(sd[32:]),
		SMBIOS:         le.Uint64(sd[40:]),
		MapInSetupPage: mapAt == sdAt+16+setupEFILen,
	}
	m := sd[16+setupEFILen : 16+setupEFILen+mapSize]
	for i := 0; i+efiDescSize <= len(m); i += efiDescSize {
		got.Map = append(got.Map, desc{le.Uint32(m[i:]), le.Uint64(m[i+8:]), le.Uint64(m[i+16:]), le.Uint64(m[i+24:]), le.Uint64(m[i+32:])})
	}
	want := handover{
		Signature: "EL64", Systab: 0x9f7ef018, DescSize: efiDescSize, DescVersion: 1, SecureBoot: 3,
		Next: 0, SetupType: setupEFI, SetupLen: setupEFILen,
		FWVendor: 0x9f7e0018, Tables: 0x9f7ee018, SMBIOS: 0x9f520000, MapInSetupPage: true,
		Map: []desc{
			{5, 0x9f600000, 0xfffffffeffc00000, 0x20, 0x800000000000000f},
			{6, 0x9f700000, 0xfffffffeffb00000, 0x10, 0x800000000000000f},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("EFI hand-over (-want +got):\n%s", diff)
	}
}

func TestEFIHandOverRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T) error
	}{
		{name: "no runtime map", run: func(t *testing.T) error {
			_, err := readEFIState(fakeEFI(t, false))
			return err
		}},
		{name: "zero page without a system table", run: func(t *testing.T) error {
			st, err := readEFIState(fakeEFI(t, true))
			if err != nil {
				t.Fatal(err)
			}
			bp := testZeroPage()
			clear(bp[bpEFIInfo : bpEFIInfo+32])
			_, _, err = planSegments(bp, testMemoryMap(1<<30), testBzImage(nil), []byte("i"), "", st)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(t); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
