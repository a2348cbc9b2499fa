package erase

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/require"
)

// loopDisk attaches image as a loop device with partition scanning and
// returns its path (/dev/loopN). It needs root and losetup.
func loopDisk(t testing.TB, image string) string {
	t.Helper()
	require.Root(t, "loop devices")
	require.Tool(t, "losetup")
	out, err := exec.Command("losetup", "-P", "-f", "--show", image).CombinedOutput()
	if err != nil {
		require.Missing(t, "no loop device available: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// eraseLoop erases dev at level through the real kernel (or sys when set).
func eraseLoop(t *testing.T, level inventoryv1.EraseLevel, sys system, dev string) (*recorder, error) {
	t.Helper()
	cfg := Config{Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	cfg.sys = sys
	rec := &recorder{}
	err := New(cfg).Erase(context.Background(), &nodev1.ErasePlan{EraseId: "loop", Level: level, Disks: []string{dev}}, rec.add)
	return rec, err
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// partitionNode is /dev/<disk>p<n>, made from sysfs when devtmpfs has
// not made it; "" when the kernel lists no such partition.
func partitionNode(t *testing.T, dev string, n int) string {
	t.Helper()
	name := filepath.Base(dev) + "p" + strconv.Itoa(n)
	devno := readString(filepath.Join("/sys/block", filepath.Base(dev), name, "dev"))
	if devno == "" {
		return ""
	}
	node := "/dev/" + name
	if _, err := os.Stat(node); err != nil {
		major, minor, _ := strings.Cut(devno, ":")
		a, _ := strconv.Atoi(major)
		b, _ := strconv.Atoi(minor)
		if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(uint32(a), uint32(b)))); err != nil {
			t.Fatalf("mknod %s: %v", node, err)
		}
		t.Cleanup(func() { os.Remove(node) })
	}
	return node
}

// TestLoopQuick erases a loop device holding a GPT, an ext4 filesystem in
// its first partition and an MD 1.0 superblock at the end of its second:
// wipefs finds nothing after, the kernel forgets the partitions
// (BLKRRPART), and the regions read back zero in the backing file.
func TestLoopQuick(t *testing.T) {
	const size = 64 * mib
	p1, p2 := extent{1 * mib, 32 * mib}, extent{33 * mib, 30 * mib}
	image := newImage(t, size)
	writeGPT(t, image, size, []extent{p1, p2})
	mkfsExt4(t, image, p1.off, p1.n)
	writeMD1(t, image, p2.off, p2.n, p2.off+(p2.n/512-16)&^7*512)
	dev := loopDisk(t, image)
	if got, ok := wipefs(t, dev); ok && got != "gpt gpt PMBR" {
		t.Fatalf("before: wipefs %s finds %q", dev, got)
	}
	if node := partitionNode(t, dev, 1); node != "" {
		if got, ok := wipefs(t, node); ok && got != "ext4" {
			t.Fatalf("before: wipefs %s finds %q", node, got)
		}
	} else {
		t.Logf("the kernel lists no partitions of %s: the erase reads the GPT itself", dev)
	}

	rec, err := eraseLoop(t, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, nil, dev)
	if err != nil {
		t.Fatalf("Erase: %v", err)
	}
	t.Logf("progress: %q", rec.details())
	if got, ok := wipefs(t, dev); ok && got != "" {
		t.Errorf("after: wipefs %s finds %q", dev, got)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), filepath.Base(dev)+"p1")); err == nil {
		t.Errorf("the kernel still lists %sp1", dev)
	}
	for _, r := range []extent{{0, mib}, {p1.off, mib}, {p1.off + p1.n - mib, mib}, {p2.off, mib}, {p2.off + p2.n - mib, mib}, {size - mib, mib}} {
		if !isZero(readAt(t, image, r.off, r.n)) {
			t.Errorf("%d MiB from the start: not zero", r.off/mib)
		}
	}
	for _, p := range []extent{p1, p2} {
		if got, ok := blkidAt(t, image, p.off, p.n); ok && got != "" {
			t.Errorf("after: blkid at %d finds %q", p.off, got)
		}
	}
}

// TestLoopMounted: a disk that is mounted is refused, unwritten (the
// check by major:minor against mountinfo; a mounted partition is the
// same check, covered on fixtures where the kernel parses no tables).
func TestLoopMounted(t *testing.T) {
	const size = 64 * mib
	image := newImage(t, size)
	mkfsExt4(t, image, 0, size)
	dev := loopDisk(t, image)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_RDONLY, ""); err != nil {
		require.Missing(t, "mount %s: %v", dev, err)
	}
	defer unix.Unmount(mnt, 0)
	_, err := eraseLoop(t, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, nil, dev)
	want := dev + " is in use: " + dev + " is mounted on " + mnt
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v, want a refusal with %q", err, want)
	}
	if got, ok := wipefs(t, dev); ok && got != "ext4" {
		t.Errorf("after a refusal wipefs finds %q", got)
	}
}

// noDiscard is the kernel with the queue's discard support hidden.
type noDiscard struct{ kernel }

func (n noDiscard) disk(p string) (disk, error) {
	d, err := n.kernel.disk(p)
	d.discard = false
	return d, err
}

// TestLoopFull fills a loop device and erases it at full twice: with
// discard (loop devices take it: the backing file's blocks are punched)
// and with discard support hidden (BLKZEROOUT). Both read back zero.
func TestLoopFull(t *testing.T) {
	const size = 48 * mib
	for name, tc := range map[string]struct {
		sys  system
		want string
	}{
		"discard":    {nil, "discarded; 66 samples read back zero"},
		"no discard": {noDiscard{kernel{root: "/"}}, "zeroed; 66 samples read back zero"},
	} {
		t.Run(name, func(t *testing.T) {
			image := newImage(t, size)
			writeAt(t, image, 0, bytes.Repeat([]byte{0xc3}, int(size)))
			dev := loopDisk(t, image)
			if tc.sys == nil {
				if n, _ := readInt(filepath.Join("/sys/block", filepath.Base(dev), "queue/discard_max_bytes")); n == 0 {
					require.KernelLacks(t, "discard on loop devices (%s: discard_max_bytes 0)", dev)
				}
			}
			rec, err := eraseLoop(t, inventoryv1.EraseLevel_ERASE_LEVEL_FULL, tc.sys, dev)
			if err != nil {
				t.Fatalf("Erase: %v", err)
			}
			if got := rec.ps[len(rec.ps)-2].GetDetail(); got != dev+": "+tc.want+" (1 of 1)" {
				t.Errorf("detail %q, want %q", got, tc.want)
			}
			if !isZero(readAt(t, image, 0, size)) {
				t.Error("the backing file does not read zero")
			}
		})
	}
}

// TestLoopSecureRefused: a loop device has no secure erase of its own.
func TestLoopSecureRefused(t *testing.T) {
	image := newImage(t, 8*mib)
	writeAt(t, image, 0, []byte("signature"))
	dev := loopDisk(t, image)
	_, err := eraseLoop(t, inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, nil, dev)
	want := dev + " has no secure erase of its own; use --erase full"
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if string(readAt(t, image, 0, 9)) != "signature" {
		t.Error("the disk was written")
	}
}

// TestLoopHeld: a disk another opener holds exclusively (as an assembled
// RAID array holds its members) is refused by the kernel's O_EXCL.
func TestLoopHeld(t *testing.T) {
	image := newImage(t, 8*mib)
	writeAt(t, image, 0, []byte("signature"))
	dev := loopDisk(t, image)
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = eraseLoop(t, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, nil, dev)
	want := dev + " is in use (the kernel refused an exclusive open"
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v, want a refusal with %q", err, want)
	}
	if string(readAt(t, image, 0, 9)) != "signature" {
		t.Error("the disk was written")
	}
}
