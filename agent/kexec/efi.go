package kexec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
)

const (
	efiDir = "/sys/firmware/efi"
	// struct efi_info in the zero page: offsets from bpEFIInfo.
	eiSignature   = 0
	eiSystab      = 4
	eiDescSize    = 8
	eiDescVersion = 12
	eiMemmap      = 16
	eiMemmapSize  = 20
	eiSystabHi    = 24
	eiMemmapHi    = 28
	bpSecureBoot  = 0x1ec

	efiDescSize    = 40 // efi_memory_desc_t as the runtime map gives it
	setupEFI       = 4  // SETUP_EFI
	setupEFILen    = 96 // struct efi_setup_data
	maxRuntimeDesc = 512
)

// efiState is this boot's EFI runtime as the next kernel needs it after a
// kexec (what kexec_file_load passes, and kexec-tools from the same
// files): the runtime regions with the virtual addresses this kernel gave
// them (SetVirtualAddressMap can be called only once), and the physical
// addresses of the firmware vendor string, the configuration table and
// SMBIOS (the system table's own pointers are virtual now).
type efiState struct {
	memmap                   []byte // efi_memory_desc_t × n
	fwVendor, tables, smbios uint64
}

// readEFIState reads dir (/sys/firmware/efi): fw_vendor, config_table,
// systab's SMBIOS line and runtime-map/N/{type,phys_addr,virt_addr,
// num_pages,attribute}.
func readEFIState(dir string) (*efiState, error) {
	var st efiState
	var err error
	for _, f := range []struct {
		name string
		v    *uint64
	}{{"fw_vendor", &st.fwVendor}, {"config_table", &st.tables}} {
		if *f.v, err = readHex(filepath.Join(dir, f.name)); err != nil {
			return nil, err
		}
	}
	if st.smbios, err = systabSMBIOS(filepath.Join(dir, "systab")); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(dir, "runtime-map"))
	if err != nil {
		return nil, err
	}
	if len(ents) == 0 || len(ents) > maxRuntimeDesc {
		return nil, fmt.Errorf("runtime map of %d entries", len(ents))
	}
	// Entries are named 0..n-1; keep the firmware's order.
	st.memmap = make([]byte, len(ents)*efiDescSize)
	for i := range ents {
		d := st.memmap[i*efiDescSize:]
		for _, f := range []struct {
			name string
			off  int
		}{{"type", 0}, {"phys_addr", 8}, {"virt_addr", 16}, {"num_pages", 24}, {"attribute", 32}} {
			v, err := readHex(filepath.Join(dir, "runtime-map", strconv.Itoa(i), f.name))
			if err != nil {
				return nil, err
			}
			if f.off == 0 {
				binary.LittleEndian.PutUint32(d, uint32(v))
			} else {
				binary.LittleEndian.PutUint64(d[f.off:], v)
			}
		}
	}
	return &st, nil
}

func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// systabSMBIOS is the SMBIOS= address of systab (0 when there is none:
// the next kernel then keeps the configuration table's own entry).
func systabSMBIOS(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "SMBIOS="); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 0, 64)
		}
	}
	return 0, sc.Err()
}

// handOver adds the runtime map and a SETUP_EFI setup_data to kmem
// (within limit) and points zero page zp at them, with the system table
// and descriptor version of this boot's zero page bp.
func (st *efiState) handOver(kmem *ukexec.Memory, zp, bp []byte, limit ukexec.Range) error {
	le := binary.LittleEndian
	cur := bp[bpEFIInfo:]
	if le.Uint32(cur[eiSystab:]) == 0 && le.Uint32(cur[eiSystabHi:]) == 0 {
		return errors.New("EFI: this boot's zero page has no system table")
	}
	// One page: setup_data header + efi_setup_data, then the map.
	buf := make([]byte, 16+setupEFILen+len(st.memmap))
	le.PutUint64(buf[0:], le.Uint64(zp[hdrSetupData:])) // next
	le.PutUint32(buf[8:], setupEFI)
	le.PutUint32(buf[12:], setupEFILen)
	le.PutUint64(buf[16:], st.fwVendor)
	le.PutUint64(buf[32:], st.tables)
	le.PutUint64(buf[40:], st.smbios)
	copy(buf[16+setupEFILen:], st.memmap)
	r, err := kmem.AddPhysSegment(buf, limit)
	if err != nil {
		return fmt.Errorf("no room for the EFI runtime map: %w", err)
	}
	le.PutUint64(zp[hdrSetupData:], uint64(r.Start))
	mapAt := uint64(r.Start) + 16 + setupEFILen
	ei := zp[bpEFIInfo:]
	copy(ei[eiSignature:eiSignature+4], cur[eiSignature:eiSignature+4])
	copy(ei[eiSystab:eiSystab+4], cur[eiSystab:eiSystab+4])
	copy(ei[eiSystabHi:eiSystabHi+4], cur[eiSystabHi:eiSystabHi+4])
	copy(ei[eiDescVersion:eiDescVersion+4], cur[eiDescVersion:eiDescVersion+4])
	le.PutUint32(ei[eiDescSize:], efiDescSize)
	le.PutUint32(ei[eiMemmap:], uint32(mapAt))
	le.PutUint32(ei[eiMemmapHi:], uint32(mapAt>>32))
	le.PutUint32(ei[eiMemmapSize:], uint32(len(st.memmap)))
	zp[bpSecureBoot] = bp[bpSecureBoot]
	return nil
}
