package bolt

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/store"
)

// The commit window (Options.CommitWindow) bounds how often the journal is
// flushed while network-driven writes keep coming. A write made under a
// context from store.WithCommitWindow (boot/dhcp's packets) may wait: its batch
// is not taken sooner than the window after the previous batch was, and
// every write that arrives meanwhile joins it. Any other write (an API
// call) never waits for the window: a batch it is in is taken at once,
// and if it arrives while the committer waits, it ends the wait. A write
// that finds no batch taken within the window is flushed at once, so a
// lone lease on a quiet appliance does not wait either.
//
// Why (bench/results/2026-11-dhcp.md, "the commit
// window", 24 Nov 2026): on the lab VM each flush
// also costs the host (the virtual disk's flush, a host fsync), and at
// ~3,300 flushes/s (3,990 leases/s, batches of 1.2) the whole VM exceeded
// its CPU allowance and was stopped for 4-11 ms at the end of most 100 ms
// periods (steal time 5-6 % per CPU): every packet in flight waited, DORA
// p99 11-14 ms. With a 1 ms window the batches hold ~4 leases, the steal
// time is ~0 and corrald's CPU per lease falls by a third; a lease waits
// at most the window plus its flush. Only the writes that opt in wait,
// because a window caps a closed loop of K writers (each waiting for its
// answer before its next write) at K writes per window: 16 such writers
// went from 52,000 to 15,000 writes/s (Benchmark, ParallelCASIncrement)
// when every write waited.
//
// It also adapts to a writer that opted in but waits for each answer
// before its next write: a wait that gathered no other write bought
// nothing, and after lonelyWaits such waits in a row the next windowSkip
// batches are taken without waiting.
const (
	lonelyWaits = 2
	windowSkip  = 64
)

// queued notes o's arrival for the window: an op that may not wait is
// counted until it is taken and ends a wait in progress. Called by queue
// before o is sent.
func (s *Store) queued(o *op) {
	if s.window <= 0 || store.MayWaitForCommit(o.ctx) {
		return
	}
	o.urgent = true
	s.urgent.Add(1)
}

// queuedSent ends a wait in progress for an urgent op, once it is queued.
func (s *Store) queuedSent(o *op) {
	if o.urgent && s.waiting.Load() {
		s.windowTimer.kick()
	}
}

// taken notes that o left the queue (taken into a batch, or given up
// before it was queued).
func (s *Store) taken(o *op) {
	if o.urgent {
		s.urgent.Add(-1)
	}
}

// awaitWindow waits out the rest of the commit window before the
// committer takes a batch (commitQueued), unless an op that may not wait
// is queued or arrives meanwhile. It reports whether it waited.
// Committer only.
func (s *Store) awaitWindow() bool {
	if s.window <= 0 {
		return false
	}
	if s.windowSkip > 0 {
		s.windowSkip--
		return false
	}
	d := s.window - time.Since(s.lastFlush)
	if d <= 0 || s.urgent.Load() > 0 {
		return false
	}
	// An urgent op queued after the check below sees waiting set and
	// kicks the timer, which by then is armed (queuedSent).
	s.waiting.Store(true)
	defer s.waiting.Store(false)
	s.windowTimer.arm(d)
	if s.urgent.Load() > 0 {
		return false
	}
	s.windowTimer.wait(d)
	s.windowWaits.Add(1)
	return true
}

// windowTaken records whether a wait gathered company: n writes taken
// after it. Committer only.
func (s *Store) windowTaken(n int) {
	if n > 1 {
		s.lonely = 0
		return
	}
	if s.lonely++; s.lonely >= lonelyWaits {
		s.lonely = 0
		s.windowSkip = windowSkip
	}
}

// windowTimer waits for sub-millisecond durations with microsecond
// precision. Go's timers wake an idle process at millisecond granularity
// (the scheduler's epoll wait takes whole milliseconds and rounds a
// shorter wait up to one), which on one P made a 1 ms window cost ~2 ms
// (DORA p50 2.0 ms against 1.0 ms with this timer,
// bench/results/2026-11-dhcp.md). A timerfd read through the runtime's
// poller wakes the poller's epoll wait when it expires, and another
// goroutine can end the wait early (kick).
// A nil timer, or one whose timerfd failed, waits with time.Sleep.
//
// Its system calls do not enter the scheduler's syscall state (settime
// and a non-blocking read return at once): the entry wakes the runtime's
// sysmon thread whenever the process was idle, which at a few thousand
// windows a second cost more than the window saved (pwrite in sync.go).
type windowTimer struct {
	fd     int
	f      *os.File
	rc     syscall.RawConn
	broken bool // committer only
}

// newWindowTimer returns a timer, or nil if the timerfd cannot be made.
func newWindowTimer() *windowTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	// A non-blocking descriptor makes a pollable File: Read parks the
	// goroutine in the runtime's poller instead of blocking a thread.
	f := os.NewFile(uintptr(fd), "commit-window-timer")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	return &windowTimer{fd: fd, f: f, rc: rc}
}

// settime sets the timer to expire once after ns nanoseconds (> 0).
func (t *windowTimer) settime(ns int64) error {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(ns)}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, uintptr(t.fd), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// arm sets the timer to expire after d (and forgets an earlier expiry or
// kick: timerfd_settime resets the count).
func (t *windowTimer) arm(d time.Duration) {
	if t == nil || t.broken {
		return
	}
	if err := t.settime(max(d.Nanoseconds(), 1)); err != nil {
		t.broken = true
	}
}

// wait returns when the armed timer expires or is kicked; d is how long
// to sleep instead if the timer does not work.
func (t *windowTimer) wait(d time.Duration) {
	if t == nil || t.broken {
		time.Sleep(d)
		return
	}
	var (
		b     [8]byte
		errno syscall.Errno
	)
	err := t.rc.Read(func(fd uintptr) bool {
		for {
			_, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch errno {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // not expired yet: wait in the poller
			default: // 0 (read the expiry count) or a failure, judged below
				return true
			}
		}
	})
	if err != nil || errno != 0 {
		t.broken = true
		time.Sleep(d)
	}
}

// kick makes the armed timer expire now. Safe from any goroutine; a kick
// when no wait is armed is forgotten by the next arm.
func (t *windowTimer) kick() {
	if t == nil {
		return
	}
	_ = t.settime(1)
}

// close releases the timer. Only when no goroutine can use it any more.
func (t *windowTimer) close() {
	if t != nil && t.f != nil {
		_ = t.f.Close()
		t.f = nil
	}
}
