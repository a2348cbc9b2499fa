package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/store"
)

// BUG 1: Update's returned Value is the overlay's own slice: a caller that
// changes it changes the stored record (Get shows it, and the fold writes
// it to bbolt while the journal had the original bytes).
func TestJournalUpdateResultIsACopy(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	kv, err := s.Update(ctx, "k", func(store.KV, bool) ([]byte, bool, error) { return []byte("original"), false, nil })
	if err != nil {
		t.Fatal(err)
	}
	copy(kv.Value, "MUTATED!") // the caller reuses its result's buffer
	got, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != "original" {
		t.Errorf("Get after the caller changed Update's result = %q, want %q", got.Value, "original")
	}
	s.Close()
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got, _ := s2.Get(ctx, "k"); string(got.Value) != "original" {
		t.Errorf("after Close (fold) and Open: %q, want %q", got.Value, "original")
	}
}

// BUG 2: a journal left beside a store file that is not the one it was
// written for is replayed into it: a store file removed (to start over),
// or replaced (a copy, an older file), adopts another store's records.
func TestJournalStrayRefused(t *testing.T) {
	ctx := t.Context()
	// Store A: three records, journaled only (the process crashed).
	a, pathA := openTemp(t)
	for _, k := range []string{"a/1", "a/2", "a/3"} {
		if _, err := a.Put(ctx, k, []byte("from A"), 0); err != nil {
			t.Fatal(err)
		}
	}
	crashA := crashCopy(t, pathA)
	a.Close()
	// Store B: another store, one record, cleanly closed (folded).
	pathB := filepath.Join(t.TempDir(), "corral.db")
	b, err := Open(pathB, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "b/1", []byte("from B"), 0); err != nil {
		t.Fatal(err)
	}
	b.Close()

	tests := map[string]func(t *testing.T, dir string){
		"store file removed": func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "corral.db")); err != nil {
				t.Fatal(err)
			}
		},
		"store file replaced by another store's": func(t *testing.T, dir string) {
			raw, err := os.ReadFile(pathB)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "corral.db"), raw, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, change := range tests {
		t.Run(name, func(t *testing.T) {
			cp := crashCopy(t, crashA)
			change(t, filepath.Dir(cp))
			s, err := Open(cp, Options{})
			if err != nil {
				t.Logf("Open refused: %v (acceptable)", err)
				return
			}
			defer s.Close()
			for _, kv := range listAll(t, s) {
				if kv.Key[0] == 'a' {
					t.Errorf("store A's %s (rev %d) replayed into a store it does not belong to", kv.Key, kv.Revision)
				}
			}
		})
	}
}

// blockingCtx is a context whose Err blocks, from the nth call on, until
// release is closed: it parks a reader inside its read (Snapshot checks
// ctx every 4096 records, the first time at the first record).
type blockingCtx struct {
	context.Context
	calls   atomic.Int32
	from    int32
	parked  chan struct{}
	release chan struct{}
}

func (c *blockingCtx) Err() error {
	if c.calls.Add(1) == c.from {
		close(c.parked)
		<-c.release
	}
	return nil
}

// BUG 3 (performance): a reader holds ovMu shared for its whole bbolt read,
// and the committer needs it exclusively after every append: a long
// Snapshot (the online backup) or List stops every write — and, since a
// waiting writer blocks new readers, every read — until it ends. Without
// the journal bbolt's readers never block its writer.
func TestLongReadDoesNotStallWrites(t *testing.T) {
	ctx := t.Context()
	s, _ := openTemp(t)
	defer s.Close()
	if os.Getenv("REVIEW_NOJOURNAL") != "" { // control: the same without the journal
		s2, err := Open(filepath.Join(t.TempDir(), "corral.db"), Options{NoJournal: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		s = s2
	}
	if _, err := s.Put(ctx, "a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	// Grow the file first so that bbolt's own remap (which does wait for
	// readers) is not what the Put below waits for.
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				s.Put(ctx, fmt.Sprintf("fill/%02d/%02d", w, i), make([]byte, 300), 0)
			}
		}()
	}
	wg.Wait()
	for i := range 200 { // and free some pages for the Put to reuse
		kv, _ := s.Get(ctx, fmt.Sprintf("fill/%02d/%02d", i%32, i/32))
		s.Delete(ctx, kv.Key, kv.Revision)
	}
	if s.jr != nil {
		foldNow(t, s)
	} // Snapshot checks ctx between bbolt records: give it some
	bc := &blockingCtx{Context: ctx, from: 2, parked: make(chan struct{}), release: make(chan struct{})}
	snapDone := make(chan error, 1)
	go func() {
		_, _, err := s.Snapshot(bc)
		snapDone <- err
	}()
	select { // the snapshot is inside its read
	case <-bc.parked:
	case err := <-snapDone:
		t.Fatalf("Snapshot ended (%v) before it was parked", err)
	}
	putDone := make(chan error, 1)
	go func() {
		_, err := s.Put(ctx, "b", []byte("2"), 0)
		putDone <- err
	}()
	select {
	case err := <-putDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		getDone := make(chan struct{})
		go func() { s.Get(ctx, "a"); close(getDone) }()
		select {
		case <-getDone:
			t.Error("a Put waited >3 s for a Snapshot in progress")
		case <-time.After(time.Second):
			t.Error("a Put waited >3 s for a Snapshot in progress, and a Get waits behind it")
		}
		close(bc.release)
		<-putDone
		<-snapDone
		return
	}
	close(bc.release)
	<-snapDone
}
