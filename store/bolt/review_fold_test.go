package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/corralhq/corral/store"
)

// TestReviewOversizedKey: a key longer than bbolt takes is refused with a
// clear error through the journal as without it. Before, the journal
// answered it, then every fold failed ("fold: key too large"), Close
// failed, and Open refused the store for good (the replay failed too).
// A key of bbolt's largest size goes through journal, crash, fold and
// Close.
func TestReviewOversizedKey(t *testing.T) {
	for name, opts := range map[string]Options{"journal": {}, "no journal": {NoJournal: true}} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "corral.db")
			s, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			long := strings.Repeat("k", bbolt.MaxKeySize+1)
			if _, err := s.Put(ctx, long, []byte("v"), 0); err == nil || !strings.Contains(err.Error(), "longer than") {
				t.Errorf("Put of a %d-byte key = %.200v, want a key-too-long error", len(long), err)
			}
			if _, err := s.Update(ctx, long, func(store.KV, bool) ([]byte, bool, error) { return []byte("v"), false, nil }); err == nil {
				t.Errorf("Update of a %d-byte key = nil, want an error", len(long))
			}
			edge := strings.Repeat("e", bbolt.MaxKeySize)
			if _, err := s.Put(ctx, edge, []byte("v"), 0); err != nil {
				t.Fatalf("Put of a %d-byte key: %v", len(edge), err)
			}
			want := listAll(t, s)
			s2, err := Open(crashCopy(t, path), Options{})
			if err != nil {
				t.Fatalf("Open after a crash: %.300v", err)
			}
			if diff := quickDiff(want, listAll(t, s2)); diff != "" {
				t.Errorf("after a crash (-answered +found):\n%s", diff)
			}
			s2.Close()
			if !opts.NoJournal {
				foldNow(t, s)
				want = listAll(t, s)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %.300v", err)
			}
			s3, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after Close: %.300v", err)
			}
			defer s3.Close()
			if diff := quickDiff(want, listAll(t, s3)); diff != "" {
				t.Fatalf("after Close and Open (-before +after):\n%s", diff)
			}
		})
	}
}

// TestReviewFailedFoldsBounded: while bbolt takes no fold (its file
// cannot grow: a full disk), the overlay does not grow past its bound.
// Before, a failed background fold only logged and the committer went on
// journaling: the overlay and the journal grew without bound (19,481 keys
// in memory for a bound of 16,384 here, every write answered). Now writes
// past the bound are refused with the fold's error, and once bbolt takes
// folds again every answered write is there, after a crash and after
// Close.
func TestReviewFailedFoldsBounded(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	s.db.MaxSize = 1 // every growth of the bbolt file fails; set before the committer sees a write
	var (
		mu       sync.Mutex
		answered = map[string]bool{}
		refused  error
		wg       sync.WaitGroup
	)
	const writers = 32
	put := func(prefix string, n int) {
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					k := fmt.Sprintf("%s/%02d/%05d", prefix, w, i)
					_, err := s.Put(ctx, k, []byte("v"), 0)
					mu.Lock()
					if err == nil {
						answered[k] = true
					} else if refused == nil {
						refused = err
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	put("full", (maxOverlayEntries+4*foldEntries)/writers)
	if n := s.ovLen(); n > maxOverlayEntries+maxBatch {
		t.Errorf("the overlay holds %d keys while no fold can complete, bound %d", n, maxOverlayEntries)
	}
	if !errors.Is(refused, berrors.ErrMaxSizeReached) {
		t.Errorf("writes past the bound while no fold completes: first error %v, want the fold's (%v)", refused, berrors.ErrMaxSizeReached)
	}
	t.Logf("while folds fail: %d answered, overlay %d keys", len(answered), s.ovLen())

	// No write is in flight: collect a retry still running, then let
	// bbolt grow again.
	s.reapFold(true)
	s.db.MaxSize = 0
	refused = nil
	put("after", 2*foldEntries/writers)
	if refused != nil {
		t.Fatalf("a write once bbolt takes folds again: %v", refused)
	}
	var keys []string
	for _, kv := range listAll(t, s) {
		keys = append(keys, kv.Key)
	}
	want := slices.Sorted(maps.Keys(answered))
	if diff := quickDiff(want, keys); diff != "" {
		t.Fatalf("records (-answered +found):\n%s", diff)
	}
	all := listAll(t, s)
	s2, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatalf("Open after a crash: %v", err)
	}
	if diff := quickDiff(all, listAll(t, s2)); diff != "" {
		t.Errorf("after a crash (-answered +found):\n%s", diff)
	}
	s2.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if diff := quickDiff(all, listAll(t, s3)); diff != "" {
		t.Fatalf("after Close and Open (-before +after):\n%s", diff)
	}
}

// holdFold makes the next background fold of s wait at stage (before its
// bbolt commit: false, after: true) until release is closed, fills s
// until a fold starts, and returns once it waits there. Later folds pass.
func holdFold(t *testing.T, s *Store, stage bool, prefix string) (release chan struct{}) {
	t.Helper()
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.foldHook = func(committed bool) {
		if committed == stage {
			once.Do(func() { close(reached); <-release })
		}
	}
	for i := range foldEntries + 1 {
		if _, err := s.Put(t.Context(), fmt.Sprintf("%s/%05d", prefix, i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("no background fold started")
	}
	return release
}

// TestReviewHeldFold: while a background fold is held before or after its
// bbolt commit, an Update and a Delete of frozen keys read their
// revisions through the frozen overlay; Get, List, ListRevision,
// Revision, Snapshot and the watch agree (newest value, deleted key gone,
// keys in order once each, revision the last answered, events
// consecutive); a batch too big for the journal waits for the fold while
// reads go on; a crash then, and one after, loses nothing answered.
func TestReviewHeldFold(t *testing.T) {
	for name, stage := range map[string]bool{"before its commit": false, "after its commit": true} {
		t.Run(name, func(t *testing.T) { testHeldFold(t, stage) })
	}
}

func testHeldFold(t *testing.T, stage bool) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	events, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var (
		evMu    sync.Mutex
		evRevs  []int64 // the revisions of the events, in order; -1: dropped
		evStart = make(chan struct{})
	)
	go func() {
		close(evStart)
		for ev := range events {
			evMu.Lock()
			evRevs = append(evRevs, ev.KV.Revision)
			evMu.Unlock()
		}
		evMu.Lock()
		evRevs = append(evRevs, -1)
		evMu.Unlock()
	}()
	<-evStart
	release := holdFold(t, s, stage, "k")
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	last, err := s.Revision(ctx)
	if err != nil || last != foldEntries+1 {
		t.Fatalf("Revision = %d, %v; want %d", last, err, foldEntries+1)
	}

	// Writes through the frozen overlay.
	upd := "k/00003"
	was, err := s.Get(ctx, upd)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := s.Update(ctx, upd, func(cur store.KV, ok bool) ([]byte, bool, error) {
		if !ok || cur.Revision != was.Revision || string(cur.Value) != "v" {
			return nil, false, fmt.Errorf("update saw %v %d %q, want the frozen record at %d", ok, cur.Revision, cur.Value, was.Revision)
		}
		return []byte("v2"), false, nil
	})
	if err != nil || kv.Revision != last+1 {
		t.Fatalf("Update of a frozen key = %d, %v; want revision %d", kv.Revision, err, last+1)
	}
	last++
	gone := "k/00005"
	g, _ := s.Get(ctx, gone)
	if err := s.Delete(ctx, gone, g.Revision); err != nil {
		t.Fatalf("Delete of a frozen key: %v", err)
	}
	last++
	if _, err := s.Put(ctx, "k/00007", nil, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create of a frozen key = %v, want ErrConflict", err)
	}
	if err := s.Delete(ctx, gone, g.Revision); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second Delete of a frozen key deleted in the overlay = %v, want ErrNotFound", err)
	}
	for i := range 20 {
		if _, err := s.Put(ctx, fmt.Sprintf("n/%02d", i), []byte("n"), 0); err != nil {
			t.Fatal(err)
		}
		last++
	}
	// Reads.
	checkReads := func(when string) []store.KV {
		t.Helper()
		if kv, err := s.Get(ctx, upd); err != nil || string(kv.Value) != "v2" || kv.Revision != foldEntries+2 {
			t.Fatalf("%s: Get %s = %q at %d, %v; want v2 at %d (the Update's)", when, upd, kv.Value, kv.Revision, err, foldEntries+2)
		}
		if _, err := s.Get(ctx, gone); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: Get of the deleted key = %v, want ErrNotFound", when, err)
		}
		all, rev, err := s.ListRevision(ctx, "")
		if err != nil || rev != last {
			t.Fatalf("%s: ListRevision revision %d, %v; want %d", when, rev, err, last)
		}
		if len(all) != foldEntries+20 {
			t.Fatalf("%s: List has %d records, want %d", when, len(all), foldEntries+20)
		}
		for i := 1; i < len(all); i++ {
			if all[i-1].Key >= all[i].Key {
				t.Fatalf("%s: List out of order or doubled: %s then %s", when, all[i-1].Key, all[i].Key)
			}
		}
		for _, kv := range all {
			if kv.Key == gone || kv.Revision > last {
				t.Fatalf("%s: List holds %s at %d (store revision %d)", when, kv.Key, kv.Revision, last)
			}
		}
		ks, err := s.List(ctx, "k/0000")
		if err != nil || len(ks) != 9 || ks[3].Key != upd || string(ks[3].Value) != "v2" {
			t.Fatalf("%s: List k/0000 = %v, %v; want 9 records with %s=v2", when, kvStrings(ks), err, upd)
		}
		srev, snap, err := s.Snapshot(ctx)
		if err != nil || srev != last {
			t.Fatalf("%s: Snapshot revision %d, %v; want %d", when, srev, err, last)
		}
		if diff := quickDiff(all, snap); diff != "" {
			t.Fatalf("%s: Snapshot differs from List (-list +snapshot):\n%s", when, diff)
		}
		if r, err := s.Revision(ctx); err != nil || r != last {
			t.Fatalf("%s: Revision = %d, %v; want %d", when, r, err, last)
		}
		return all
	}
	want := checkReads("fold held")
	var wantRevs []int64
	for r := range last {
		wantRevs = append(wantRevs, r+1)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		evMu.Lock()
		got := slices.Clone(evRevs)
		evMu.Unlock()
		if len(got) >= len(wantRevs) || time.Now().After(deadline) {
			if diff := quickDiff(wantRevs, got); diff != "" {
				t.Fatalf("event revisions (-want +got):\n%s", diff)
			}
			break
		}
	}

	// A batch too big for the journal waits for the held fold; reads do not.
	s.foldBytes = 4096
	big := make(chan error, 1)
	go func() {
		r, err := s.Put(ctx, "zbig", make([]byte, 5000), 0)
		if err == nil && r != last+1 {
			err = fmt.Errorf("revision %d, want %d", r, last+1)
		}
		big <- err
	}()
	time.Sleep(50 * time.Millisecond) // the committer is in the foreground fold, waiting
	select {
	case err := <-big:
		t.Fatalf("the big Put returned while the fold was held: %v", err)
	default:
	}
	checkReads("big batch waiting")
	cp := crashCopy(t, path) // nothing writes: the committer waits for the held fold
	close(release)
	released = true
	if err := <-big; err != nil {
		t.Fatalf("big Put: %v", err)
	}
	s.foldBytes = foldBytes
	last++
	s2, err := Open(cp, Options{})
	if err != nil {
		t.Fatalf("Open after a crash during the held fold: %v", err)
	}
	if diff := quickDiff(want, listAll(t, s2)); diff != "" {
		t.Errorf("after a crash during the held fold (-answered +found):\n%s", diff)
	}
	s2.Close()

	if r, err := s.Put(ctx, "zz", nil, 0); err != nil || r != last+1 {
		t.Fatalf("Put after the big one = %d, %v; want %d", r, err, last+1)
	}
	want = listAll(t, s)
	s3, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatalf("Open after a crash: %v", err)
	}
	defer s3.Close()
	if diff := quickDiff(want, listAll(t, s3)); diff != "" {
		t.Fatalf("after a crash (-answered +found):\n%s", diff)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReviewCloseDuringFold: Close waits for a background fold held
// before its commit, folds the rest and leaves no fold running; the store
// opens with everything answered and both journal files empty.
func TestReviewCloseDuringFold(t *testing.T) {
	s, path := openTemp(t)
	release := holdFold(t, s, false, "k")
	if _, err := s.Put(t.Context(), "after", []byte("a"), 0); err != nil {
		t.Fatal(err)
	}
	want := listAll(t, s)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned while a fold was held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if s.foldDone != nil || s.frozen != nil || len(s.ov) != 0 {
		t.Fatalf("after Close: fold running %v, frozen %d keys, overlay %d keys", s.foldDone != nil, len(s.frozen), len(s.ov))
	}
	for _, jp := range journalPaths(path) {
		if fi, err := os.Stat(jp); err != nil || fi.Size() != fileHeader {
			t.Fatalf("%s after Close: %v, %v; want its header only", jp, fi.Size(), err)
		}
	}
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if diff := quickDiff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("(-before +after):\n%s", diff)
	}
}

// TestReviewOldAndLeftoverJournals: a data dir as the previous Corral
// left it after a crash (corral.db.journal only, with records) opens and
// replays, with and without the journal; a store opened with NoJournal
// replays records a crash left in both files during a fold, writes to
// bbolt alone, and opens again with the journal.
func TestReviewOldAndLeftoverJournals(t *testing.T) {
	ctx := t.Context()
	t.Run("only corral.db.journal", func(t *testing.T) {
		s, path := openTemp(t)
		for i := range 50 {
			if _, err := s.Put(ctx, fmt.Sprintf("k/%02d", i), []byte("v"), 0); err != nil {
				t.Fatal(err)
			}
		}
		want := listAll(t, s)
		cp := crashCopy(t, path)
		s.Close()
		if err := os.Remove(journalPaths(cp)[1]); err != nil {
			t.Fatal(err)
		}
		for name, opts := range map[string]Options{"journal": {}, "no journal": {NoJournal: true}} {
			c := crashCopy(t, cp)
			s2, err := Open(c, opts)
			if err != nil {
				t.Fatalf("%s: Open: %v", name, err)
			}
			if diff := quickDiff(want, listAll(t, s2)); diff != "" {
				t.Errorf("%s: (-answered +found):\n%s", name, diff)
			}
			if r, err := s2.Put(ctx, "next", nil, 0); err != nil || r != 51 {
				t.Errorf("%s: Put = %d, %v; want revision 51", name, r, err)
			}
			if err := s2.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("NoJournal after a crash during a fold", func(t *testing.T) {
		s, path := openTemp(t)
		release := holdFold(t, s, false, "k")
		if _, err := s.Put(ctx, "during", nil, 0); err != nil {
			t.Fatal(err)
		}
		want := listAll(t, s)
		cp := crashCopy(t, path)
		close(release)
		s.Close()
		for _, jp := range journalPaths(cp) {
			if fi, err := os.Stat(jp); err != nil || fi.Size() <= fileHeader {
				t.Fatalf("%s in the crash copy: %v, %v; want records", jp, fi, err)
			}
		}
		s2, err := Open(cp, Options{NoJournal: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := quickDiff(want, listAll(t, s2)); diff != "" {
			t.Fatalf("(-answered +found):\n%s", diff)
		}
		if r, err := s2.Put(ctx, "bolt", nil, 0); err != nil || r != foldEntries+3 {
			t.Fatalf("Put = %d, %v; want revision %d", r, err, foldEntries+3)
		}
		want = listAll(t, s2)
		s3, err := Open(crashCopy(t, cp), Options{})
		if err != nil {
			t.Fatalf("Open with the journal after NoJournal writes: %v", err)
		}
		if diff := quickDiff(want, listAll(t, s3)); diff != "" {
			t.Fatalf("(-answered +found):\n%s", diff)
		}
		s3.Close()
		s2.Close()
	})
}

// TestReviewAppendFailsDuringFold: the journal append right after a fold
// started fails (the file it switched to cannot be written): that batch
// and every later write are refused, reads keep everything answered, the
// fold still lands, Close returns, and the store opens with everything
// answered and nothing of the refused batch.
func TestReviewAppendFailsDuringFold(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	// The file the next fold switches the committer to, read-only. No
	// write is in flight: the committer sees the change with the next op.
	rw := s.jnext.f
	ro, err := os.Open(rw.Name())
	if err != nil {
		t.Fatal(err)
	}
	s.jnext.f = ro
	defer rw.Close()
	var refusedAt string
	for i := range foldEntries + 1 {
		k := fmt.Sprintf("k/%05d", i)
		if _, err := s.Put(ctx, k, []byte("v"), 0); err != nil {
			refusedAt = k
			break
		}
	}
	if refusedAt == "" {
		t.Fatal("no write refused: the fold did not switch files")
	}
	if _, err := s.Put(ctx, "later", nil, 0); err == nil || !strings.Contains(err.Error(), "refused until restart") {
		t.Fatalf("a later Put = %v, want refused until restart", err)
	}
	kvs := listAll(t, s)
	if len(kvs) != foldEntries {
		t.Fatalf("List has %d records, want the %d answered", len(kvs), foldEntries)
	}
	if _, err := s.Get(ctx, refusedAt); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of the refused key = %v, want ErrNotFound", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.folds.Load() != 1 {
		t.Fatalf("%d folds, want the one started", s.folds.Load())
	}
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if diff := quickDiff(kvs, listAll(t, s2)); diff != "" {
		t.Fatalf("(-answered +found):\n%s", diff)
	}
}

// TestReviewFoldsWhileBboltGrows: background folds that grow the bbolt
// file (each growth remaps it, waiting for every read transaction) run
// under Get, List, Snapshot, Revision and Update without a deadlock, and
// no read sees a revision go back or a created key vanish. A deadlock
// fails the test with every goroutine's stack.
func TestReviewFoldsWhileBboltGrows(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	s.foldBytes = 32 << 10 // a fold every ~30 values
	watchdog := time.AfterFunc(90*time.Second, func() { panic("store/bolt: deadlock? 90 s without the writers finishing") })
	defer watchdog.Stop()
	const writers, perWriter = 8, 250
	value := bytes.Repeat([]byte("x"), 1024)
	var readErr atomic.Value
	fail := func(format string, a ...any) { readErr.CompareAndSwap(nil, fmt.Sprintf(format, a...)) }
	stop := make(chan struct{})
	var rg sync.WaitGroup
	for r := range 4 {
		rg.Add(1)
		go func() {
			defer rg.Done()
			var lastRev int64
			var lastCount int
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond): // leave the writers the CPU
				}
				var rev int64
				var n int
				var err error
				switch r {
				case 0:
					var kvs []store.KV
					kvs, rev, err = s.ListRevision(ctx, "k/")
					n = len(kvs)
				case 1:
					var kvs []store.KV
					rev, kvs, err = s.Snapshot(ctx)
					for _, kv := range kvs {
						if strings.HasPrefix(kv.Key, "k/") {
							n++
						}
					}
				case 2:
					rev, err = s.Revision(ctx)
					n = lastCount
				case 3:
					var kv store.KV
					if kv, err = s.Get(ctx, "k/0/0000"); isNotFound(err) {
						err = nil
					} else if err == nil {
						n, rev = lastCount, max(lastRev, kv.Revision)
					}
				}
				if err != nil {
					fail("reader %d: %v", r, err)
					return
				}
				if rev < lastRev || n < lastCount {
					fail("reader %d: revision %d -> %d, keys %d -> %d", r, lastRev, rev, lastCount, n)
				}
				lastRev, lastCount = max(lastRev, rev), max(lastCount, n)
			}
		}()
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				if _, err := s.Put(ctx, fmt.Sprintf("k/%d/%04d", w, i), value, 0); err != nil {
					fail("put: %v", err)
					return
				}
				if i%10 == 0 {
					if _, err := s.Update(ctx, "counter", func(cur store.KV, ok bool) ([]byte, bool, error) {
						return append(cur.Value, 'c'), false, nil
					}); err != nil {
						fail("update: %v", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	watchdog.Stop()
	if e := readErr.Load(); e != nil {
		t.Fatal(e)
	}
	fi, _ := os.Stat(path)
	t.Logf("%d folds, bbolt file %d MiB", s.folds.Load(), fi.Size()>>20)
	if s.folds.Load() < 10 {
		t.Fatalf("only %d folds", s.folds.Load())
	}
	want := listAll(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got := listAll(t, s2)
	if !slices.EqualFunc(want, got, func(a, b store.KV) bool {
		return a.Key == b.Key && a.Revision == b.Revision && bytes.Equal(a.Value, b.Value)
	}) {
		t.Fatalf("after Close and Open: %d records, before %d, or some differ", len(got), len(want))
	}
	if kv, _ := s2.Get(ctx, "counter"); len(kv.Value) != writers*perWriter/10 {
		t.Fatalf("counter has %d updates, want %d", len(kv.Value), writers*perWriter/10)
	}
}

// quickDiff is cmp.Diff with a fast path for equal slices: cmp takes
// seconds on thousands of records under -race.
func quickDiff[T any](want, got []T) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	return cmp.Diff(want, got)
}

// TestReviewSlowFoldBoundsJournal: while a background fold is held (a
// slow disk), the active journal file grows to its hard bound and no
// further: the next write waits for the fold, then goes on.
func TestReviewSlowFoldBoundsJournal(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	release := holdFold(t, s, false, "k")
	value := make([]byte, 1<<20)
	done := make(chan int, 1)
	go func() {
		i := 0
		for ; i < maxJournalBytes>>20+4; i++ {
			if _, err := s.Put(ctx, fmt.Sprintf("big/%02d", i), value, 0); err != nil {
				break
			}
		}
		done <- i
	}()
	// Wait until the writer is stuck: the active file stops growing.
	var size int64
	for deadline := time.Now().Add(60 * time.Second); ; {
		time.Sleep(200 * time.Millisecond)
		var now int64
		for _, jp := range journalPaths(path) {
			if fi, err := os.Stat(jp); err == nil {
				now = max(now, fi.Size())
			}
		}
		select {
		case n := <-done:
			close(release)
			t.Fatalf("%d writes of 1 MiB went through while the fold was held (journal %d MiB)", n, now>>20)
		default:
		}
		if now == size && now > maxJournalBytes/2 || time.Now().After(deadline) {
			size = now
			break
		}
		size = now
	}
	if size > maxJournalBytes {
		t.Errorf("the journal reached %d bytes while the fold was held, bound %d", size, maxJournalBytes)
	}
	close(release)
	if n := <-done; n != maxJournalBytes>>20+4 {
		t.Fatalf("after the fold: %d writes, want %d", n, maxJournalBytes>>20+4)
	}
}
