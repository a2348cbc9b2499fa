package bolt

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
)

func openWindow(t *testing.T, window time.Duration) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(path, Options{CommitWindow: window})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s, path
}

// TestCommitWindowGathers: writes under WithCommitWindow that arrive one
// by one (as DHCP requests do) within the window after a flush share one
// flush, taken no sooner than the window after the previous batch. Without
// the window each would be flushed on its own.
func TestCommitWindowGathers(t *testing.T) {
	const window = 500 * time.Millisecond
	s, _ := openWindow(t, window)
	defer s.Close()
	ctx := store.WithCommitWindow(t.Context())
	start := time.Now()
	if _, err := s.Put(ctx, "first", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if w := s.windowWaits.Load(); w != 0 {
		t.Fatalf("the first write waited for the window (%d waits): a write after a quiet spell must not", w)
	}
	before := s.commits.Load()
	var wg sync.WaitGroup
	took := make([]time.Duration, 4)
	for i := range took {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			if _, err := s.Put(ctx, fmt.Sprintf("k/%d", i), []byte("v"), 0); err != nil {
				t.Error(err)
			}
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	if n := s.commits.Load() - before; n != 1 {
		t.Errorf("4 writes arriving 10 ms apart within a %s window took %d flushes, want 1", window, n)
	}
	for i, d := range took {
		if d < window {
			t.Errorf("write %d answered %s after the first flush, before the window (%s) ended", i, d, window)
		}
	}
	if got := len(listAll(t, s)); got != 5 {
		t.Errorf("%d records, want 5", got)
	}
}

// TestCommitWindowUrgentWrite: a write not made under WithCommitWindow (an
// API call) never waits for the window: alone after a flush it is
// flushed at once, and arriving while the committer waits it ends the
// wait, taking the waiting writes with it.
func TestCommitWindowUrgentWrite(t *testing.T) {
	const window = 20 * time.Second // a wait that ran out would fail the test by its length
	s, _ := openWindow(t, window)
	defer s.Close()
	plain := t.Context()
	mayWait := store.WithCommitWindow(plain)
	if _, err := s.Put(mayWait, "first", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := s.Put(plain, "api-1", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > window/4 {
		t.Errorf("a plain write right after a flush took %s: it waited for the window", d)
	}
	// A lease write now waits for the window; an API write ends the wait.
	leaseDone := make(chan time.Duration, 1)
	go func() {
		t1 := time.Now()
		if _, err := s.Put(mayWait, "lease", []byte("v"), 0); err != nil {
			t.Error(err)
		}
		leaseDone <- time.Since(t1)
	}()
	deadline := time.Now().Add(window / 4)
	for !s.waiting.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the lease write never waited for the window")
		}
		time.Sleep(time.Millisecond)
	}
	before := s.commits.Load()
	t2 := time.Now()
	if _, err := s.Put(plain, "api-2", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t2); d > window/4 {
		t.Errorf("a plain write arriving during a wait took %s: it did not end the wait", d)
	}
	select {
	case d := <-leaseDone:
		if d > window/2 {
			t.Errorf("the waiting lease write took %s", d)
		}
	case <-time.After(window / 2):
		t.Fatal("the waiting lease write was not answered")
	}
	if n := s.commits.Load() - before; n > 2 {
		t.Errorf("the plain write and the waiting lease took %d flushes, want at most 2", n)
	}
	if u := s.urgent.Load(); u != 0 {
		t.Errorf("urgent = %d after every write returned", u)
	}
}

// TestCommitWindowSequentialWriter: a writer under WithCommitWindow that
// waits for each answer before its next write gains nothing from waiting;
// after lonelyWaits waits that gathered no one, the window is skipped for
// windowSkip batches.
func TestCommitWindowSequentialWriter(t *testing.T) {
	s, _ := openWindow(t, 20*time.Millisecond)
	defer s.Close()
	ctx := store.WithCommitWindow(t.Context())
	for i := range 2 + windowSkip {
		if _, err := s.Put(ctx, fmt.Sprintf("k/%03d", i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if w := s.windowWaits.Load(); w != lonelyWaits {
		t.Errorf("%d sequential writes waited %d times, want %d", 2+windowSkip, w, lonelyWaits)
	}
}

// TestCommitWindowEveryWriteAnswered: with the window on, writers mixing
// writes that may wait, plain writes, Updates of one hot key and contexts
// that end while queued all finish; every answered write is in the store,
// survives a crash (the copy the files leave) at its revision, and no
// counter is left behind.
func TestCommitWindowEveryWriteAnswered(t *testing.T) {
	s, path := openWindow(t, 500*time.Microsecond)
	defer s.Close()
	want := writeEverywhere(t, s, 16, 120, 200*time.Microsecond, func(w, i int) bool { return (w+i)%3 != 0 })
	if u := s.urgent.Load(); u != 0 {
		t.Errorf("urgent = %d after every write returned", u)
	}
	if s.windowWaits.Load() == 0 {
		t.Error("no write waited for the window: the test did not exercise it")
	}
	s2, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer s2.Close()
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("records after the crash (-answered +found):\n%s", diff)
	}
}

// TestFoldYields: with one P (corrald on one core) a fold lets other
// goroutines (the packet reader, the committer) run every foldYieldKeys
// keys instead of holding the P for the whole fold.
func TestFoldYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s, _ := openTemp(t)
	defer s.Close()
	entries := map[string]ovEntry{}
	for i := range foldEntries {
		entries[fmt.Sprintf("k/%05d", i)] = ovEntry{rev: int64(i + 1), value: []byte("v")}
	}
	seen := make(chan int64, 1)
	go func() { seen <- s.foldKeys.Load() }()
	if err := s.writeFold(entries, foldEntries); err != nil {
		t.Fatal(err)
	}
	if n := <-seen; n > 2*foldYieldKeys {
		t.Errorf("another goroutine first ran after the fold had written %d of %d keys, want at most %d", n, foldEntries, 2*foldYieldKeys)
	}
}

// TestWindowTimer: the timer waits at least as long as armed; a kick
// ends an armed wait at once and is forgotten by the next arm; a nil
// timer (no timerfd) sleeps instead.
func TestWindowTimer(t *testing.T) {
	const d = 30 * time.Millisecond
	for name, tm := range map[string]*windowTimer{"timerfd": newWindowTimer(), "nil": nil} {
		t.Run(name, func(t *testing.T) {
			defer tm.close()
			start := time.Now()
			tm.arm(d)
			tm.wait(d)
			if took := time.Since(start); took < d {
				t.Errorf("armed for %s, waited %s", d, took)
			}
			tm.kick() // no wait armed: forgotten by the next arm
			start = time.Now()
			tm.arm(d)
			tm.wait(d)
			if took := time.Since(start); took < d {
				t.Errorf("a kick before arm ended the next wait after %s, want at least %s", took, d)
			}
			if tm == nil {
				return
			}
			tm.arm(time.Hour)
			go func() { time.Sleep(5 * time.Millisecond); tm.kick() }()
			start = time.Now()
			tm.wait(time.Hour)
			if took := time.Since(start); took > time.Minute {
				t.Errorf("a kick did not end the wait (%s)", took)
			}
			if tm.broken {
				t.Error("the timerfd failed and the timer fell back to sleeping")
			}
		})
	}
}
