package erase

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// TestStructLayouts pins the kernel structures' sizes and offsets (64-bit).
func TestStructLayouts(t *testing.T) {
	var c nvmeCommand
	var h sgIOHdr
	got := map[string]uintptr{
		"nvme size": unsafe.Sizeof(c), "nvme nsid": unsafe.Offsetof(c.nsid), "nvme addr": unsafe.Offsetof(c.addr),
		"nvme data_len": unsafe.Offsetof(c.dataLen), "nvme cdw10": unsafe.Offsetof(c.cdw10),
		"nvme timeout_ms": unsafe.Offsetof(c.timeoutMS), "nvme result": unsafe.Offsetof(c.result),
		"sg size": unsafe.Sizeof(h), "sg dxferp": unsafe.Offsetof(h.dxferp), "sg timeout": unsafe.Offsetof(h.timeout),
		"sg usr_ptr": unsafe.Offsetof(h.usrPtr), "sg status": unsafe.Offsetof(h.status), "sg info": unsafe.Offsetof(h.info),
	}
	want := map[string]uintptr{
		"nvme size": 72, "nvme nsid": 4, "nvme addr": 24, "nvme data_len": 36, "nvme cdw10": 40, "nvme timeout_ms": 64, "nvme result": 68,
		"sg size": 88, "sg dxferp": 16, "sg timeout": 40, "sg usr_ptr": 56, "sg status": 64, "sg info": 80,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layouts (-want +got):\n%s", diff)
	}
}

func TestFormatCDW10(t *testing.T) {
	tests := map[string]struct {
		flbas, dps byte
		want       uint32
	}{
		"format 0, no metadata, no protection": {0x00, 0x00, 0x200},
		"format 2, extended metadata":          {0x12, 0x00, 0x200 | 0x10 | 0x2},
		"format 1, PI type 1 first":            {0x01, 0x09, 0x200 | 1<<8 | 1<<5 | 0x1},
		"format 17 (upper bits)":               {0x21, 0x00, 0x200 | 1<<12 | 0x1},
	}
	for name, tc := range tests {
		if got := formatCDW10(tc.flbas, tc.dps); got != tc.want {
			t.Errorf("%s: cdw10 = %#x, want %#x", name, got, tc.want)
		}
	}
}

// fakeNVMe is an NVMe namespace (nsid 1) whose controller answers
// Identify from the test's fields and carries out Format NVM and
// sanitize on the image (zeroing it, or filling it with fill).
type fakeNVMe struct {
	*fileDevice
	size          int64
	oacs          uint16
	sanicap       uint32
	fna           byte
	flbas, dps    byte
	formatStatus  uint32
	fill          byte // what a format leaves (0: zeros)
	formatDelay   time.Duration
	sent          []nvmeCommand
	sanitizePolls int
}

func (f *fakeNVMe) nvmeNSID() (uint32, error) { return 1, nil }

func (f *fakeNVMe) nvmeAdmin(cmd *nvmeCommand, data []byte) (uint32, error) {
	if int(cmd.dataLen) != len(data) {
		return 0, fmt.Errorf("data_len %d for a %d-byte buffer", cmd.dataLen, len(data))
	}
	f.sent = append(f.sent, *cmd)
	switch cmd.opcode {
	case nvmeIdentify:
		switch cmd.cdw10 {
		case 1:
			copy(data[24:], "QEMU NVMe Ctrl                          ")
			binary.LittleEndian.PutUint16(data[256:], f.oacs)
			binary.LittleEndian.PutUint32(data[328:], f.sanicap)
			data[524] = f.fna
		case 0:
			data[26], data[29] = f.flbas, f.dps
		}
	case nvmeFormatNVM, nvmeSanitize:
		time.Sleep(f.formatDelay)
		if cmd.opcode == nvmeFormatNVM && f.formatStatus != 0 {
			cmd.result = 0
			return f.formatStatus, nil
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{f.fill}, int(f.size)), 0); err != nil {
			return 0, err
		}
	case nvmeGetLogPage:
		f.sanitizePolls++
		binary.LittleEndian.PutUint16(data[0:], 0x8000)
		sstat := uint16(2) // in progress
		if f.sanitizePolls > 1 {
			sstat = 1
		}
		binary.LittleEndian.PutUint16(data[2:], sstat)
	}
	return 0, nil
}

func TestNVMe(t *testing.T) {
	const size = 4 * mib
	identCtrl := nvmeCommand{opcode: nvmeIdentify, cdw10: 1, dataLen: 4096}
	identNS := nvmeCommand{opcode: nvmeIdentify, nsid: 1, dataLen: 4096}
	format := nvmeCommand{opcode: nvmeFormatNVM, nsid: 1, cdw10: 0x212, timeoutMS: 7200000}
	tests := map[string]struct {
		nvme    fakeNVMe
		want    []nvmeCommand
		detail  string
		err     string
		refusal bool
		console string
		noCtrl  bool
	}{
		"no controller device": {
			noCtrl:  true,
			err:     "no NVMe controller device found for the namespace (/sys/block/nvme0n1/device, /dev/nvmeX)",
			refusal: true,
		},
		"format with user data erase": {
			nvme:    fakeNVMe{oacs: nvmeOACSFormat, flbas: 0x12},
			want:    []nvmeCommand{identCtrl, identNS, format},
			detail:  "NVMe Format NVM with user data erase; 66 samples read back zero",
			console: "NVMe Format NVM (opcode 0x80, nsid 0x1, cdw10 0x00000212, cdw11 0x00000000, data 0 bytes, timeout 7200000 ms): status 0x0 (success), result 0x0",
		},
		"format leaves ones: zeroed after": {
			nvme:   fakeNVMe{oacs: nvmeOACSFormat, flbas: 0x12, fill: 0xff},
			want:   []nvmeCommand{identCtrl, identNS, format},
			detail: "NVMe Format NVM with user data erase, then zeroed; 66 samples read back zero",
		},
		"controller refuses the format": {
			nvme:    fakeNVMe{oacs: nvmeOACSFormat, flbas: 0x12, formatStatus: 0x4002},
			want:    []nvmeCommand{identCtrl, identNS, format},
			err:     "NVMe Format NVM (opcode 0x80, nsid 0x1, cdw10 0x00000212, cdw11 0x00000000, data 0 bytes, timeout 7200000 ms): the controller answered status 0x4002 (type 0 code 0x02: invalid field in command)",
			console: "status 0x4002 (type 0 code 0x02: invalid field in command)",
		},
		"sanitize only": {
			nvme: fakeNVMe{sanicap: nvmeSanitizeCrypto | nvmeSanitizeBlock},
			want: []nvmeCommand{identCtrl, {opcode: nvmeSanitize, cdw10: 2},
				{opcode: nvmeGetLogPage, nsid: 0xffffffff, cdw10: 0x81 | 127<<16, dataLen: 512},
				{opcode: nvmeGetLogPage, nsid: 0xffffffff, cdw10: 0x81 | 127<<16, dataLen: 512}},
			detail: "NVMe sanitize (block erase); 66 samples read back zero",
		},
		"neither": {
			nvme:    fakeNVMe{},
			want:    []nvmeCommand{identCtrl},
			err:     "the NVMe controller supports neither Format NVM nor sanitize",
			refusal: true,
		},
	}
	sanitizePoll = time.Millisecond
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := newImage(t, size)
			writeAt(t, path, 0, bytes.Repeat([]byte{0x5a}, int(size)))
			d := fileDisk(t, "nvme0n1", path)
			d.kind, d.ctrl = kindNVMe, "/dev/nvme0"
			if tc.noCtrl {
				d.ctrl = ""
			}
			fake := tc.nvme
			sys := &fileSys{disks: map[string]disk{"/dev/nvme0n1": d}, wrap: func(_ disk, dev *fileDevice) device {
				fake.fileDevice, fake.size = dev, size
				return &fake
			}}
			rec, console, err := run(t, sys, inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, "/dev/nvme0n1")
			if diff := cmp.Diff(tc.want, fake.sent, cmp.AllowUnexported(nvmeCommand{}), cmp.FilterPath(func(p cmp.Path) bool {
				return p.Last().String() == ".addr"
			}, cmp.Ignore())); diff != "" {
				t.Errorf("commands sent (-want +got):\n%s", diff)
			}
			if !strings.Contains(console, tc.console) {
				t.Errorf("console lacks %q:\n%s", tc.console, console)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || tc.refusal != errors.Is(err, ErrRefused) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Erase: %v", err)
			}
			if got := rec.ps[len(rec.ps)-2].GetDetail(); got != "/dev/nvme0n1: "+tc.detail+" (1 of 1)" {
				t.Errorf("detail %q, want %q", got, tc.detail)
			}
			if !isZero(readAt(t, path, 0, size)) {
				t.Error("the namespace does not read zero")
			}
		})
	}
}

// fakeATA is an ATA drive answering IDENTIFY with security word sec.
type fakeATA struct {
	*fileDevice
	sec, eraseTime uint16
	sent           []string
}

func (f *fakeATA) ataIdentify() ([]byte, error) {
	id := make([]byte, 512)
	binary.LittleEndian.PutUint16(id[82*2:], 1<<1)
	binary.LittleEndian.PutUint16(id[128*2:], f.sec)
	binary.LittleEndian.PutUint16(id[89*2:], f.eraseTime)
	binary.LittleEndian.PutUint16(id[90*2:], f.eraseTime)
	copy(id[54:], "AT AQEUH RADDSI K") // byte-swapped "ATA QEMU HARDDISK"
	return id, nil
}

func (f *fakeATA) ataPassThrough(cdb, data []byte, timeout time.Duration) error {
	s := fmt.Sprintf("% x", cdb)
	if data != nil {
		s += fmt.Sprintf(" data %02x %q", data[:2], bytes.TrimRight(data[2:34], "\x00"))
	}
	f.sent = append(f.sent, s+" timeout "+timeout.String())
	if cdb[14] == ataSecurityEraseUnit {
		_, err := f.WriteAt(make([]byte, 4*mib), 0)
		return err
	}
	return nil
}

func TestATA(t *testing.T) {
	tests := map[string]struct {
		sec, eraseTime uint16
		err            string
		want           []string
		detail         string
	}{
		"not supported": {sec: 0, err: "/dev/sda: the ATA security feature set is not supported"},
		"frozen":        {sec: ataSecSupported | ataSecFrozen, err: "/dev/sda: the ATA security feature set is frozen"},
		"locked":        {sec: ataSecSupported | ataSecEnabled | ataSecLocked, err: "locked by an ATA security password"},
		"enabled":       {sec: ataSecSupported | ataSecEnabled, err: "an ATA security password is already set"},
		"enhanced erase": {
			sec: ataSecSupported | ataSecEnhanced, eraseTime: 5,
			want: []string{
				`85 0a 06 00 00 00 01 00 00 00 00 00 00 00 f1 00 data 0000 "corral-erase" timeout 30s`,
				`85 06 00 00 00 00 00 00 00 00 00 00 00 00 f3 00 timeout 30s`,
				`85 0a 06 00 00 00 01 00 00 00 00 00 00 00 f4 00 data 0200 "corral-erase" timeout 40m0s`,
			},
			detail: "ATA SECURITY ERASE UNIT (enhanced); 66 samples read back zero",
		},
		"normal erase, time not given": {
			sec: ataSecSupported,
			want: []string{
				`85 0a 06 00 00 00 01 00 00 00 00 00 00 00 f1 00 data 0000 "corral-erase" timeout 30s`,
				`85 06 00 00 00 00 00 00 00 00 00 00 00 00 f3 00 timeout 30s`,
				`85 0a 06 00 00 00 01 00 00 00 00 00 00 00 f4 00 data 0000 "corral-erase" timeout 12h0m0s`,
			},
			detail: "ATA SECURITY ERASE UNIT (normal); 66 samples read back zero",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := newImage(t, 4*mib)
			writeAt(t, path, 0, bytes.Repeat([]byte{0x5a}, int(4*mib)))
			fake := &fakeATA{sec: tc.sec, eraseTime: tc.eraseTime}
			sys := &fileSys{disks: map[string]disk{"/dev/sda": {name: "sda", path: path, size: 4 * mib, kind: kindATA}}, wrap: func(_ disk, dev *fileDevice) device {
				fake.fileDevice = dev
				return fake
			}}
			rec, _, err := run(t, sys, inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, "/dev/sda")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if len(fake.sent) != 0 {
					t.Errorf("commands sent to a drive that refused: %q", fake.sent)
				}
				return
			}
			if err != nil {
				t.Fatalf("Erase: %v", err)
			}
			if diff := cmp.Diff(tc.want, fake.sent); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
			if got := rec.ps[len(rec.ps)-2].GetDetail(); got != "/dev/sda: "+tc.detail+" (1 of 1)" {
				t.Errorf("detail %q, want %q", got, tc.detail)
			}
		})
	}
}

// TestNVMeFormatReportsWhileWaiting: a format that takes a while is
// reported on while the command blocks.
func TestNVMeFormatReportsWhileWaiting(t *testing.T) {
	path := newImage(t, 4*mib)
	d := fileDisk(t, "nvme0n1", path)
	d.kind, d.ctrl = kindNVMe, "/dev/nvme0"
	fake := &fakeNVMe{oacs: nvmeOACSFormat, formatDelay: 1500 * time.Millisecond}
	sys := &fileSys{disks: map[string]disk{"/dev/nvme0n1": d}, wrap: func(_ disk, dev *fileDevice) device {
		fake.fileDevice, fake.size = dev, 4*mib
		return fake
	}}
	e := New(Config{sys: sys, ProgressEvery: 100 * time.Millisecond})
	rec := &recorder{}
	if err := e.Erase(context.Background(), &nodev1.ErasePlan{Level: inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, Disks: []string{"/dev/nvme0n1"}}, rec.add); err != nil {
		t.Fatal(err)
	}
	if want := "/dev/nvme0n1: NVMe Format NVM, user data erase, 1s so far (1 of 1)"; !slices.Contains(rec.details(), want) {
		t.Errorf("no %q in %q", want, rec.details())
	}
}
