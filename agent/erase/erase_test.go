package erase

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// fileSys stands in for the kernel: each disk is a regular file, described
// by the test; wrap, when set, replaces the opened device (a device that
// lies about discard, an NVMe controller, an ATA drive).
type fileSys struct {
	disks map[string]disk
	wrap  func(d disk, dev *fileDevice) device
}

func (s *fileSys) disk(p string) (disk, error) {
	d, ok := s.disks[p]
	if !ok {
		return disk{}, refuse("%s is not a whole disk on this machine", p)
	}
	return d, nil
}

func (s *fileSys) open(d disk) (device, error) {
	f, err := os.OpenFile(d.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	dev, err := openFile(f)
	if err != nil {
		return nil, err
	}
	if s.wrap != nil {
		return s.wrap(d, dev), nil
	}
	return dev, nil
}

// fileDisk describes the image at path as disk name.
func fileDisk(t *testing.T, name, path string) disk {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return disk{name: name, path: path, size: st.Size()}
}

// recorder keeps the Progress reports.
type recorder struct {
	mu sync.Mutex
	ps []*nodev1.Progress
}

func (r *recorder) add(p *nodev1.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ps = append(r.ps, p)
}

func (r *recorder) details() []string {
	var out []string
	for _, p := range r.ps {
		out = append(out, p.GetDetail())
	}
	return out
}

func (r *recorder) last() *nodev1.Progress {
	if len(r.ps) == 0 {
		return nil
	}
	return r.ps[len(r.ps)-1]
}

// run erases the named disks of sys at level.
func run(t *testing.T, sys system, level inventoryv1.EraseLevel, disks ...string) (*recorder, string, error) {
	t.Helper()
	var console bytes.Buffer
	e := New(Config{sys: sys, Console: &console, Samples: 64})
	rec := &recorder{}
	err := e.Erase(context.Background(), &nodev1.ErasePlan{EraseId: "erase-1", Level: level, Disks: disks}, rec.add)
	for _, p := range rec.ps {
		if p.GetInstallId() != "erase-1" {
			t.Errorf("progress %v lacks the erase id", p)
		}
	}
	return rec, console.String(), err
}

func isZero(b []byte) bool { return allZero(b) }

// TestQuickFiles erases partition tables and signatures from images and
// checks, with wipefs and blkid where installed and by reading bytes, that
// nothing is left, while the middle of each partition is left alone.
func TestQuickFiles(t *testing.T) {
	const size = 64 * mib
	p1, p2 := extent{1 * mib, 32 * mib}, extent{33 * mib, 30 * mib}
	type probe struct {
		at   extent
		want string // what blkid finds there before the erase
	}
	tests := map[string]struct {
		build  func(t *testing.T, path string)
		probes []probe
		parts  []extent // what the kernel lists
		whole  string   // what wipefs finds on the whole image before
	}{
		"gpt, ext4 in p1, md 1.0 at the end of p2": {
			build: func(t *testing.T, path string) {
				writeGPT(t, path, size, []extent{p1, p2})
				mkfsExt4(t, path, p1.off, p1.n)
				writeMD1(t, path, p2.off, p2.n, p2.off+(p2.n/512-16)&^7*512)
			},
			probes: []probe{{p1, "ext4"}, {p2, "linux_raid_member"}},
			whole:  "gpt gpt PMBR",
		},
		"gpt known only to the disk, not the kernel": {
			build: func(t *testing.T, path string) {
				writeGPT(t, path, size, []extent{p1, p2})
				mkfsExt4(t, path, p1.off, p1.n)
				writeMD1(t, path, p2.off, p2.n, p2.off+4*kib) // 1.2
			},
			probes: []probe{{p1, "ext4"}, {p2, "linux_raid_member"}},
			whole:  "gpt gpt PMBR",
		},
		"mbr, ext4 in p1, md 1.1 at the start of p2": {
			build: func(t *testing.T, path string) {
				writeMBR(t, path, []extent{p1, p2})
				mkfsExt4(t, path, p1.off, p1.n)
				writeMD1(t, path, p2.off, p2.n, p2.off)
			},
			probes: []probe{{p1, "ext4"}, {p2, "linux_raid_member"}},
			whole:  "dos",
		},
		"whole-disk md 0.90 at the end, lvm label at the start": {
			build: func(t *testing.T, path string) {
				writeLVM(t, path, 0)
				writeMD090(t, path, 0, size)
			},
			whole: "linux_raid_member",
		},
		"whole-disk ext4": {
			build: func(t *testing.T, path string) { mkfsExt4(t, path, 0, size) },
			whole: "ext4",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := newImage(t, size)
			tc.build(t, path)
			// A marker in the middle of each partition: quick leaves it.
			marker := []byte("corral-marker")
			for _, p := range []extent{p1, p2} {
				writeAt(t, path, p.off+p.n/2, marker)
			}
			if got, ok := wipefs(t, path); ok && !strings.Contains(got, tc.whole) {
				t.Fatalf("before the erase wipefs finds %q, want %q", got, tc.whole)
			}
			for _, p := range tc.probes {
				if got, ok := blkidAt(t, path, p.at.off, p.at.n); ok && got != p.want {
					t.Fatalf("before the erase blkid at %d finds %q, want %q", p.at.off, got, p.want)
				}
			}

			d := fileDisk(t, "vdb", path)
			if !strings.Contains(name, "not the kernel") {
				d.parts = []extent{p1, p2}
			}
			rec, _, err := run(t, &fileSys{disks: map[string]disk{"/dev/vdb": d}}, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, "/dev/vdb")
			if err != nil {
				t.Fatalf("Erase: %v", err)
			}
			if last := rec.last(); last.GetStep() != StepErased || !last.GetDone() || last.GetError() != "" {
				t.Fatalf("last progress = %v", last)
			}

			if got, ok := wipefs(t, path); ok && got != "" {
				t.Errorf("after the erase wipefs finds %q", got)
			}
			for _, p := range []extent{p1, p2} {
				if got, ok := blkidAt(t, path, p.off, p.n); ok && got != "" {
					t.Errorf("after the erase blkid at %d finds %q", p.off, got)
				}
				for _, r := range []extent{{p.off, mib}, {p.off + p.n - mib, mib}} {
					if !isZero(readAt(t, path, r.off, r.n)) {
						t.Errorf("%d MiB from the start: not zero", r.off/mib)
					}
				}
				if got := readAt(t, path, p.off+p.n/2, int64(len(marker))); !bytes.Equal(got, marker) {
					t.Errorf("the middle of the partition at %d was touched: %q", p.off, got)
				}
			}
			for _, r := range []extent{{0, mib}, {size - mib, mib}} {
				if !isZero(readAt(t, path, r.off, r.n)) {
					t.Errorf("the disk's region at %d is not zero", r.off)
				}
			}
		})
	}
}

// TestQuickRegions checks the regions quick zeroes: ends of the disk and
// of each partition, merged, clipped, none longer than the buffer.
func TestQuickRegions(t *testing.T) {
	path := newImage(t, 10*mib)
	d := fileDisk(t, "vdb", path)
	d.parts = []extent{{mib, 512 * kib}, {2 * mib, 3 * mib}, {9*mib + 512*kib, 4 * mib}}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dev, _ := openFile(f)
	w := &work{d: d, dev: dev}
	got, n := w.quickRegions()
	want := []extent{{0, mib}, {mib, 512 * kib}, {2 * mib, mib}, {4 * mib, mib}, {9 * mib, mib}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(extent{})); diff != "" || n != 3 {
		t.Errorf("regions (-want +got):\n%s (partitions %d)", diff, n)
	}
}

// lyingDiscard is a device whose discard says yes and does nothing, as a
// device whose discarded blocks keep reading old data does.
type lyingDiscard struct {
	*fileDevice
	discards, zeroouts int
}

func (l *lyingDiscard) discard(off, n int64) error { l.discards++; return nil }
func (l *lyingDiscard) zeroout(off, n int64) error {
	l.zeroouts++
	return l.fileDevice.zeroout(off, n)
}

// noZeroout has neither discard nor zeroout.
type noZeroout struct{ *fileDevice }

func (noZeroout) discard(off, n int64) error { return unix.EOPNOTSUPP }
func (noZeroout) zeroout(off, n int64) error { return unix.EOPNOTSUPP }

// TestFullFiles fills an image and erases it at full through each path:
// discard kept (a file's punched hole reads zero), discard that left data
// (caught by the read-back, then zeroed), no discard support (zeroout),
// and neither (written zeros). The whole image must read zero.
func TestFullFiles(t *testing.T) {
	const size = 8 * mib
	tests := map[string]struct {
		discard bool
		wrap    func(d disk, dev *fileDevice) device
		want    string
	}{
		"discard reads back zero": {discard: true, want: "discarded; 66 samples read back zero"},
		"discard leaves data": {discard: true, want: "zeroed; 66 samples read back zero",
			wrap: func(_ disk, dev *fileDevice) device { return &lyingDiscard{fileDevice: dev} }},
		"no discard": {want: "zeroed; 66 samples read back zero"},
		"neither discard nor zeroout": {discard: true, want: "zeros written; 66 samples read back zero",
			wrap: func(_ disk, dev *fileDevice) device { return noZeroout{dev} }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := newImage(t, size)
			writeAt(t, path, 0, bytes.Repeat([]byte{0xa5}, int(size)))
			d := fileDisk(t, "vdb", path)
			d.discard = tc.discard
			var devs []device
			sys := &fileSys{disks: map[string]disk{"/dev/vdb": d}, wrap: func(d disk, dev *fileDevice) device {
				var out device = dev
				if tc.wrap != nil {
					out = tc.wrap(d, dev)
				}
				devs = append(devs, out)
				return out
			}}
			rec, _, err := run(t, sys, inventoryv1.EraseLevel_ERASE_LEVEL_FULL, "/dev/vdb")
			if err != nil {
				t.Fatalf("Erase: %v (progress %q)", err, rec.details())
			}
			if !isZero(readAt(t, path, 0, size)) {
				t.Fatal("the image does not read zero")
			}
			want := "/dev/vdb: " + tc.want + " (1 of 1)"
			if got := rec.ps[len(rec.ps)-2].GetDetail(); got != want {
				t.Errorf("disk's last detail = %q, want %q", got, want)
			}
			if l, ok := devs[0].(*lyingDiscard); ok && (l.discards == 0 || l.zeroouts == 0) {
				t.Errorf("discards %d, zeroouts %d: want both", l.discards, l.zeroouts)
			}
		})
	}
}

// slowDevice takes a while per zeroout so progress ticks.
type slowDevice struct{ *fileDevice }

func (s slowDevice) zeroout(off, n int64) error {
	time.Sleep(5 * time.Millisecond)
	return s.fileDevice.zeroout(off, n)
}

// TestProgress checks the progress contract: per-disk details with "(N of
// M)", "N GiB of M GiB"-style reports during long work, and the final
// "erased".
func TestProgress(t *testing.T) {
	a, b := newImage(t, 1*gib), newImage(t, 4*mib)
	sys := &fileSys{
		disks: map[string]disk{"/dev/vda": {name: "vda", path: a, size: 1 * gib}, "/dev/vdb": {name: "vdb", path: b, size: 4 * mib}},
		wrap:  func(_ disk, dev *fileDevice) device { return slowDevice{dev} },
	}
	e := New(Config{sys: sys, ProgressEvery: time.Millisecond, Samples: 4})
	rec := &recorder{}
	plan := &nodev1.ErasePlan{EraseId: "e-2", Level: inventoryv1.EraseLevel_ERASE_LEVEL_FULL, Disks: []string{"/dev/vda", "/dev/vdb"}}
	if err := e.Erase(context.Background(), plan, rec.add); err != nil {
		t.Fatal(err)
	}
	details := rec.details()
	joined := strings.Join(details, "\n")
	for _, want := range []string{
		"/dev/vda: full erase of 1 GiB (1 of 2)",
		"/dev/vda: zeroing (1 of 2)",
		"/dev/vda: zeroing, 512 MiB of 1 GiB (1 of 2)",
		"/dev/vda: zeroed; 6 samples read back zero (1 of 2)",
		"/dev/vdb: full erase of 4 MiB (2 of 2)",
		"/dev/vdb: zeroed; 6 samples read back zero (2 of 2)",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("no progress %q in:\n%s", want, joined)
		}
	}
	last := rec.last()
	if last.GetStep() != StepErased || !last.GetDone() || last.GetInstallId() != "e-2" || last.GetError() != "" {
		t.Errorf("last progress = %v", last)
	}
	for _, p := range rec.ps[:len(rec.ps)-1] {
		if p.GetStep() != StepErase || p.GetDone() {
			t.Errorf("intermediate progress %v", p)
		}
	}
}

// failingWrite fails every write.
type failingWrite struct{ *fileDevice }

func (failingWrite) WriteAt([]byte, int64) (int, error) { return 0, unix.EIO }

// TestStopsAtFirstFailure: the second disk fails, the third is never
// touched, the error names the disk erased before it.
func TestStopsAtFirstFailure(t *testing.T) {
	paths := []string{newImage(t, 4*mib), newImage(t, 4*mib), newImage(t, 4*mib)}
	for _, p := range paths {
		writeAt(t, p, 0, []byte("signature"))
	}
	sys := &fileSys{
		disks: map[string]disk{
			"/dev/vda": {name: "vda", path: paths[0], size: 4 * mib},
			"/dev/vdb": {name: "vdb", path: paths[1], size: 4 * mib},
			"/dev/vdc": {name: "vdc", path: paths[2], size: 4 * mib},
		},
		wrap: func(d disk, dev *fileDevice) device {
			if d.name == "vdb" {
				return failingWrite{dev}
			}
			return dev
		},
	}
	rec, _, err := run(t, sys, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, "/dev/vda", "/dev/vdb", "/dev/vdc")
	if err == nil {
		t.Fatal("no error")
	}
	want := "erase /dev/vdb: zero 1 MiB at 0: input/output error (erased before it: /dev/vda)"
	if err.Error() != want {
		t.Errorf("error\n %q\nwant\n %q", err, want)
	}
	last := rec.last()
	if last.GetStep() != StepErase || !last.GetDone() || last.GetError() != want {
		t.Errorf("last progress = %v", last)
	}
	if string(readAt(t, paths[2], 0, 9)) != "signature" {
		t.Error("the disk after the failing one was touched")
	}
	if !isZero(readAt(t, paths[0], 0, 9)) {
		t.Error("the disk before the failing one was not erased")
	}
}

// TestRefusals: a bad disk name refuses the whole plan before any disk is
// written; secure on a disk with no erase of its own is refused with the
// reason; a level the agent does not carry out is refused.
func TestRefusals(t *testing.T) {
	good := newImage(t, 4*mib)
	writeAt(t, good, 0, []byte("signature"))
	sys := &fileSys{disks: map[string]disk{
		"/dev/vda":     {name: "vda", path: "/dev/vda", size: 4 * mib},
		"/dev/vdb":     {name: "vdb", path: good, size: 4 * mib},
		"/dev/nvme0n1": {name: "nvme0n1", path: good, size: 4 * mib, kind: kindNVMe, ctrl: "/dev/nvme0"},
	}}
	tests := map[string]struct {
		level inventoryv1.EraseLevel
		disks []string
		want  string
	}{
		"bad path":                   {inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, []string{"/dev/vdb", "/dev/../etc/passwd"}, "/dev/../etc/passwd is not a whole disk on this machine"},
		"twice":                      {inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, []string{"/dev/vdb", "/dev/vdb"}, "/dev/vdb: named twice in the plan"},
		"secure":                     {inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, []string{"/dev/vda"}, "erase /dev/vda: /dev/vda has no secure erase of its own; use --erase full (no disk erased)"},
		"default":                    {inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT, []string{"/dev/vdb"}, "erase refused: erase level ERASE_LEVEL_DEFAULT is not one the agent carries out (quick, full, secure or none)"},
		"secure, one of two without": {inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, []string{"/dev/nvme0n1", "/dev/vda"}, "erase /dev/vda: /dev/vda has no secure erase of its own; use --erase full (no disk erased)"},
		"secure vd":                  {inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, []string{"/dev/vdb"}, "has no secure erase of its own; use --erase full"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec, _, err := run(t, sys, tc.level, tc.disks...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrRefused) {
				t.Fatalf("error %v, want one with %q wrapping ErrRefused", err, tc.want)
			}
			if last := rec.last(); !last.GetDone() || last.GetError() != err.Error() {
				t.Errorf("last progress %v", last)
			}
			if string(readAt(t, good, 0, 9)) != "signature" {
				t.Error("a disk was written")
			}
		})
	}
	rec, _, err := run(t, sys, inventoryv1.EraseLevel_ERASE_LEVEL_NONE, "/dev/vdb")
	if err != nil || rec.last().GetStep() != StepErased || string(readAt(t, good, 0, 9)) != "signature" {
		t.Errorf("level none: %v, %v", err, rec.last())
	}
}

// TestContextCancelled stops between chunks.
func TestContextCancelled(t *testing.T) {
	path := newImage(t, 8*mib)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e := New(Config{sys: &fileSys{disks: map[string]disk{"/dev/vda": fileDisk(t, "vda", path)}}})
	err := e.Erase(ctx, &nodev1.ErasePlan{Level: inventoryv1.EraseLevel_ERASE_LEVEL_FULL, Disks: []string{"/dev/vda"}}, func(*nodev1.Progress) {})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}

var _ io.ReaderAt = (*fileDevice)(nil)
