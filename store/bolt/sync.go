package bolt

import (
	"io"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oneP reports whether the Go scheduler runs with a single P (GOMAXPROCS
// 1: corrald on one core, which is what the runtime picks when its CPU
// affinity is one CPU). The committer then behaves like a single-threaded
// server (journal.go, commit.go).
func oneP() bool { return runtime.GOMAXPROCS(0) == 1 }

// fdatasync makes f's data durable. With a single P it keeps the P
// through the call instead of entering the scheduler's syscall state:
// measured on one pinned core (bench/results/2026-11-dhcp.md, "one P", 24 Nov 2026), the
// usual entry cost more than it bought. The P was handed to another
// thread after ~20 µs (sysmon), and on return the committing goroutine
// had no P and waited in the global run queue, holding the commit
// pipeline, behind every goroutine made runnable meanwhile: one in 1,000
// commits then took 5-10 ms, every write behind it waited, and
// GOMAXPROCS=1 collapsed under load. Holding the P, nothing else of the
// process runs for the ~0.1-0.2 ms of the flush (as in any
// single-threaded server that syncs), packets wait in the socket buffer,
// and the next batch is whatever queued meanwhile. The price: while the
// disk does not answer the whole process waits with it (with more Ps only
// this goroutine does, so they keep the ordinary call).
func fdatasync(f *os.File) error {
	if !oneP() {
		return unix.Fdatasync(int(f.Fd()))
	}
	if _, _, e := unix.RawSyscall(unix.SYS_FDATASYNC, f.Fd(), 0, 0); e != 0 {
		return e
	}
	return nil
}

// pwrite writes b at off in f. With a single P it keeps the P through
// the call, like fdatasync: a write into the page cache takes ~25 µs, and
// entering the scheduler's syscall state for it wakes the runtime's
// sysmon thread whenever the process was idle, after which sysmon polls
// every 20 µs until it is idle again (boot/dhcp's rawio.go measured what
// that costs on one core).
func pwrite(f *os.File, b []byte, off int64) error {
	if !oneP() {
		_, err := f.WriteAt(b, off)
		return err
	}
	fd := f.Fd()
	for len(b) > 0 {
		n, _, e := syscall.RawSyscall6(syscall.SYS_PWRITE64, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(off), 0, 0)
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return &os.PathError{Op: "write", Path: f.Name(), Err: e}
		case n == 0:
			return &os.PathError{Op: "write", Path: f.Name(), Err: io.ErrShortWrite}
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
