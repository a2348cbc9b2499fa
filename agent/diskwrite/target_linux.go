package diskwrite

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// target is what Write knows of the device it writes.
type target struct {
	block bool
	size  int64
	// sysfs queue directory of a block device ("" for a file).
	queue string
	// set after a zeroing method failed as unsupported, so it is not
	// tried again for every gap.
	noZeroout, noDiscard, noPunch bool
}

func openTarget(f *os.File) (target, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return target{}, fmt.Errorf("stat: %w", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return target{size: st.Size}, nil
	case unix.S_IFBLK:
		var size uint64
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
			return target{}, fmt.Errorf("BLKGETSIZE64: %w", errno)
		}
		q := fmt.Sprintf("/sys/dev/block/%d:%d/queue", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
		return target{block: true, size: int64(size), queue: q}, nil
	default:
		return target{}, errors.New("neither a block device nor a regular file")
	}
}

// zero makes [off, off+n) read zero and says how.
func (t *target) zero(f *os.File, off, n int64) (string, error) {
	if !t.block {
		if !t.noPunch {
			err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
			if err == nil {
				return "punch_hole", nil
			}
			if !unsupported(err) {
				return "", fmt.Errorf("punch hole: %w", err)
			}
			t.noPunch = true
		}
		return "write", writeZeros(f, off, n)
	}
	// The ioctls take 512-byte aligned ranges; the unaligned head and
	// tail (only where an image's size is not a sector multiple) are
	// written.
	const sector = 512
	as, ae := (off+sector-1)/sector*sector, (off+n)/sector*sector
	if ae <= as {
		return "write", writeZeros(f, off, n)
	}
	if as > off {
		if err := writeZeros(f, off, as-off); err != nil {
			return "", err
		}
	}
	if ae < off+n {
		if err := writeZeros(f, ae, off+n-ae); err != nil {
			return "", err
		}
	}
	r := [2]uint64{uint64(as), uint64(ae - as)}
	if !t.noZeroout {
		err := ioctlRange(f, unix.BLKZEROOUT, &r)
		if err == nil {
			return "zeroout", nil
		}
		if !unsupported(err) {
			return "", fmt.Errorf("BLKZEROOUT: %w", err)
		}
		t.noZeroout = true
	}
	if !t.noDiscard && t.discardZeroes() {
		err := ioctlRange(f, unix.BLKDISCARD, &r)
		if err == nil {
			return "discard", nil
		}
		if !unsupported(err) {
			return "", fmt.Errorf("BLKDISCARD: %w", err)
		}
	}
	t.noDiscard = true
	return "write", writeZeros(f, as, ae-as)
}

func ioctlRange(f *os.File, req uint, r *[2]uint64) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(r))); errno != 0 {
		return errno
	}
	return nil
}

// discardZeroes reports whether the queue promises that discarded blocks
// read zero. Kernels since 4.12 always say 0 here (the promise moved to
// write-zeroes, which BLKZEROOUT uses), so discard is a path for old
// kernels only.
func (t *target) discardZeroes() bool {
	read := func(name string) string {
		b, _ := os.ReadFile(t.queue + "/" + name)
		return strings.TrimSpace(string(b))
	}
	return read("discard_zeroes_data") == "1" && read("discard_max_bytes") != "0" && read("discard_max_bytes") != ""
}

func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)
}

// dropCache writes back and drops the device's cached pages so the
// read-back reads the medium (best effort).
func (t *target) dropCache(f *os.File) {
	_ = unix.Fdatasync(int(f.Fd()))
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	if t.block {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKFLSBUF, 0)
	}
}
