package bolt

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s, path
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := openTemp(t)
		return s
	})
}

// TestContractNoJournal: the same contract when every batch commits to
// bbolt directly (Options.NoJournal; also the path of a batch too big for
// the journal).
func TestContractNoJournal(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "corral.db"), Options{NoJournal: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestDurability(t *testing.T) {
	s, path := openTemp(t)
	ctx := t.Context()
	var last int64
	revs := map[string]int64{}
	put := func(key, value string) int64 {
		t.Helper()
		r, err := s.Put(ctx, key, []byte(value), revs[key])
		if err != nil {
			t.Fatalf("Put(%q): %v", key, err)
		}
		last, revs[key] = r, r
		return r
	}
	for i := range 50 {
		put(fmt.Sprintf("k/%03d", i), fmt.Sprintf("v%d", i))
	}
	put("k/007", "updated")
	gone := put("gone", "x")
	if err := s.Delete(ctx, "gone", gone); err != nil {
		t.Fatal(err)
	}
	before, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("re-Open: %v", err)
	}
	defer s.Close()
	after, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Fatalf("records changed across restart (-before +after):\n%s", diff)
	}
	if _, err := s.Get(ctx, "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted key after restart: %v, want ErrNotFound", err)
	}
	next, err := s.Put(ctx, "new", []byte("n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	// The delete took revision last+1; the revision survives the restart.
	if next <= last+1 {
		t.Fatalf("first revision after restart = %d, want > %d", next, last+1)
	}
}

// TestGroupCommit checks that concurrent writers share commits.
func TestGroupCommit(t *testing.T) {
	const (
		writers = 64
		each    = 5
	)
	s, _ := openTemp(t)
	defer s.Close()
	ctx := t.Context()

	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			<-start
			for i := range each {
				if _, err := s.Put(ctx, fmt.Sprintf("w%02d/%d", w, i), []byte("v"), 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	commits, writes := s.commits.Load(), s.writes.Load()
	t.Logf("%d writes in %d commits", writes, commits)
	if writes != writers*each {
		t.Fatalf("writes = %d, want %d", writes, writers*each)
	}
	if commits >= writes {
		t.Fatalf("commits = %d, not fewer than writes = %d: writes were not grouped", commits, writes)
	}
}

// TestBatchSemantics drives one batch through commit directly: each op sees
// the effects of the ops before it, failures are per op, and the whole
// batch is one commit.
func TestBatchSemantics(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	ctx := t.Context()
	base, err := s.Put(ctx, "existing", []byte("e"), 0)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	mk := func(c context.Context, kind opKind, key, value string, rev int64) *op {
		return &op{ctx: c, kind: kind, key: key, value: []byte(value), rev: rev, done: make(chan result, 1)}
	}
	batch := []*op{
		mk(ctx, opPut, "a", "1", 0),             // ok: base+1
		mk(ctx, opPut, "a", "again", 0),         // conflict: created just above
		mk(ctx, opPut, "a", "2", base+1),        // ok: sees the create, base+2
		mk(ctx, opDelete, "missing", "", 5),     // not found
		mk(cancelled, opPut, "skipped", "x", 0), // ctx ended: not applied
		mk(ctx, opDelete, "existing", "", base), // ok: base+3
		mk(ctx, opPut, "existing", "back", 0),   // ok: sees the delete, base+4
		mk(ctx, opDelete, "a", "", base+1),      // conflict: a is at base+2
	}
	commitsBefore := s.commits.Load()
	s.commit(batch)

	wants := []struct {
		rev int64
		err error
	}{
		{base + 1, nil},
		{0, store.ErrConflict},
		{base + 2, nil},
		{0, store.ErrNotFound},
		{0, context.Canceled},
		{base + 3, nil},
		{base + 4, nil},
		{0, store.ErrConflict},
	}
	for i, o := range batch {
		got := <-o.done
		if got.rev != wants[i].rev || !errors.Is(got.err, wants[i].err) || (wants[i].err == nil && got.err != nil) {
			t.Errorf("op %d: got (%d, %v), want (%d, %v)", i, got.rev, got.err, wants[i].rev, wants[i].err)
		}
	}
	if n := s.commits.Load() - commitsBefore; n != 1 {
		t.Errorf("batch took %d commits, want 1", n)
	}

	var evs []store.Event
	for range 4 {
		evs = append(evs, <-watch)
	}
	wantEvs := []store.Event{
		{Type: store.EventPut, KV: store.KV{Key: "a", Value: []byte("1"), Revision: base + 1}},
		{Type: store.EventPut, KV: store.KV{Key: "a", Value: []byte("2"), Revision: base + 2}},
		{Type: store.EventDelete, KV: store.KV{Key: "existing", Revision: base + 3}},
		{Type: store.EventPut, KV: store.KV{Key: "existing", Value: []byte("back"), Revision: base + 4}},
	}
	if diff := cmp.Diff(wantEvs, evs); diff != "" {
		t.Errorf("events mismatch (-want +got):\n%s", diff)
	}
	if _, err := s.Get(ctx, "skipped"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("op with cancelled ctx was applied: %v", err)
	}

	// A batch in which nothing applies writes nothing.
	commitsBefore = s.commits.Load()
	o := mk(ctx, opPut, "a", "stale", base)
	s.commit([]*op{o})
	if got := <-o.done; !errors.Is(got.err, store.ErrConflict) {
		t.Errorf("stale put: %v, want ErrConflict", got.err)
	}
	if n := s.commits.Load() - commitsBefore; n != 0 {
		t.Errorf("all-conflict batch took %d commits, want 0", n)
	}
}

// TestCommitFailure checks that when the transaction cannot commit, every
// op in the batch gets the error and no event is published.
func TestCommitFailure(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if _, err := s.Put(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	watch, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// Close the database under the committer's feet.
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
	_, putErr := s.Put(ctx, "new", []byte("v"), 0)
	delErr := s.Delete(ctx, "k", 1)
	for _, err := range []error{putErr, delErr} {
		if err == nil || !errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
			t.Errorf("write on failed commit: %v, want the commit error", err)
		}
	}
	select {
	case ev := <-watch:
		t.Errorf("event published for a failed commit: %v", ev)
	default:
	}
	_ = s.Close() // db already closed; only stops the committer
}

func TestSlowWatcherDropped(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	ctx := t.Context()
	s.hub.SetBuffer(4)
	ch, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var rev int64
	for range 10 {
		if rev, err = s.Put(ctx, "k", []byte("v"), rev); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for range ch {
		n++
	}
	if n != 4 {
		t.Fatalf("slow watcher got %d events before being closed, want 4", n)
	}
}

func TestEmptyKeyRejected(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	if _, err := s.Put(t.Context(), "", []byte("v"), 0); err == nil {
		t.Fatal("Put with empty key succeeded")
	}
}

func TestLocked(t *testing.T) {
	s, path := openTemp(t)
	defer s.Close()
	start := time.Now()
	_, err := Open(path, Options{Timeout: 100 * time.Millisecond})
	if err == nil {
		t.Fatal("second Open of a locked file succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("second Open took %s", d)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("error %q should name the path and say it is locked", err)
	}
	// The first store is unaffected.
	if _, err := s.Put(t.Context(), "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
}

// populated returns the path of a closed store file holding some records.
func populated(t *testing.T) string {
	t.Helper()
	s, path := openTemp(t)
	ctx := t.Context()
	val := bytes.Repeat([]byte("x"), 200)
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Go(func() {
			for i := range 50 {
				if _, err := s.Put(ctx, fmt.Sprintf("rec/%d/%02d", w, i), val, 0); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeBolt creates a plain bbolt file at a new path and lets fn fill it.
func writeBolt(t *testing.T, fn func(tx *bbolt.Tx) error) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOpenRefusesDamagedFiles(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T) string
	}{
		{"truncated to half", func(t *testing.T) string {
			path := populated(t)
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, info.Size()/2); err != nil {
				t.Fatal(err)
			}
			return path
		}},
		{"first 4KiB garbage", func(t *testing.T) string {
			path := populated(t)
			overwrite(t, path, 0, randomBytes(t, 4096))
			return path
		}},
		{"both meta pages garbage", func(t *testing.T) string {
			path := populated(t)
			overwrite(t, path, 0, randomBytes(t, 8192))
			return path
		}},
		{"data pages garbage", func(t *testing.T) string {
			path := populated(t)
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			overwrite(t, path, 8192, randomBytes(t, int(info.Size())-8192))
			return path
		}},
		{"zero length", func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "empty.db")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return path
		}},
		{"not a bbolt file", func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "text.db")
			if err := os.WriteFile(path, []byte("hello, I am not a database\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return path
		}},
		{"foreign bbolt file", func(t *testing.T) string {
			return writeBolt(t, func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucket([]byte("something-else"))
				if err != nil {
					return err
				}
				return b.Put([]byte("k"), []byte("v"))
			})
		}},
		{"bbolt file with only our records bucket", func(t *testing.T) string {
			return writeBolt(t, func(tx *bbolt.Tx) error {
				_, err := tx.CreateBucket(recordsBucket)
				return err
			})
		}},
		{"short record", func(t *testing.T) string {
			return writeBolt(t, func(tx *bbolt.Tx) error {
				meta, err := tx.CreateBucket(metaBucket)
				if err != nil {
					return err
				}
				recs, err := tx.CreateBucket(recordsBucket)
				if err != nil {
					return err
				}
				if err := meta.Put(formatKey, []byte(formatV1)); err != nil {
					return err
				}
				if err := meta.Put(revKey, encodeRev(3)); err != nil {
					return err
				}
				return recs.Put([]byte("k"), []byte{1, 2, 3})
			})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.make(t)
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded on a damaged file")
			}
			t.Logf("Open: %v", err)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("error does not wrap store.ErrCorrupt: %v", err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error does not name the file %s: %v", path, err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(orig, after) {
				t.Errorf("Open modified the file (%d bytes before, %d after)", len(orig), len(after))
			}
			// The failed Open released the file: a sound file at the same
			// path opens again.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			s, err = Open(path, Options{Timeout: time.Second})
			if err != nil {
				t.Fatalf("Open after replacing the damaged file: %v", err)
			}
			s.Close()
		})
	}
}

// TestOpenEmptyBoltFile checks that a valid bbolt file with no buckets is
// taken as a new store.
func TestOpenEmptyBoltFile(t *testing.T) {
	path := writeBolt(t, func(*bbolt.Tx) error { return nil })
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	rev, err := s.Put(t.Context(), "k", []byte("v"), 0)
	if err != nil || rev != 1 {
		t.Fatalf("Put = (%d, %v), want (1, nil)", rev, err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func overwrite(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}
