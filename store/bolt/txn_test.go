package bolt

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
)

// txnMove is a transaction of the shape the tests below commit: it puts
// k/<i>/a and k/<i>/b and deletes k/<i-1>/a, one revision for all three.
func txnMove(t *testing.T, s *Store, i int, prevA int64) int64 {
	t.Helper()
	ops := []store.Op{
		{Kind: store.OpPut, Key: fmt.Sprintf("k/%03d/a", i), Value: []byte("a")},
		{Kind: store.OpPut, Key: fmt.Sprintf("k/%03d/b", i), Value: []byte("b")},
	}
	if i > 0 {
		ops = append(ops, store.Op{Kind: store.OpDelete, Key: fmt.Sprintf("k/%03d/a", i-1), Rev: prevA})
	}
	rev, err := s.Txn(t.Context(), ops)
	if err != nil {
		t.Fatalf("Txn %d: %v", i, err)
	}
	return rev
}

// TestTxnReopen: a committed transaction is in the store after a clean
// Close and Open, at its one revision.
func TestTxnReopen(t *testing.T) {
	for name, opts := range map[string]Options{"journal": {}, "no journal": {NoJournal: true}} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "corral.db")
			s, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			r0 := txnMove(t, s, 0, 0)
			r1 := txnMove(t, s, 1, r0)
			want := listAll(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
				t.Fatalf("after reopen (-before +after):\n%s", diff)
			}
			wantKVs := []string{"k/000/b@" + fmt.Sprint(r0), "k/001/a@" + fmt.Sprint(r1), "k/001/b@" + fmt.Sprint(r1)}
			var got []string
			for _, kv := range want {
				got = append(got, fmt.Sprintf("%s@%d", kv.Key, kv.Revision))
			}
			if diff := cmp.Diff(wantKVs, got); diff != "" {
				t.Fatalf("records (-want +got):\n%s", diff)
			}
			if rev, err := s2.Revision(t.Context()); err != nil || rev != r1 {
				t.Fatalf("Revision after reopen = %d, %v; want %d", rev, err, r1)
			}
		})
	}
}

// TestTxnJournalCrash: transactions answered before a crash, journaled in
// batches with plain writes and not yet folded, are replayed whole at
// their revisions, and the revision goes on from the last.
func TestTxnJournalCrash(t *testing.T) {
	s, path := openTemp(t)
	defer s.Close()
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last int64
	for w := range 6 {
		wg.Go(func() {
			for i := range 20 {
				var rev int64
				var err error
				if w%2 == 0 {
					rev, err = s.Txn(ctx, []store.Op{
						{Kind: store.OpPut, Key: fmt.Sprintf("t/%d/%02d/x", w, i), Value: []byte("x")},
						{Kind: store.OpPut, Key: fmt.Sprintf("t/%d/%02d/y", w, i), Value: []byte("y")},
					})
				} else {
					rev, err = s.Put(ctx, fmt.Sprintf("p/%d/%02d", w, i), []byte("p"), 0)
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				last = max(last, rev)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if s.folds.Load() != 0 {
		t.Fatal("a fold ran: the test wants everything in the journal")
	}
	want := listAll(t, s)
	s2, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer s2.Close()
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("records after the crash (-answered +found):\n%s", diff)
	}
	if rev, err := s2.Revision(ctx); err != nil || rev != last {
		t.Fatalf("Revision after the crash = %d, %v; want %d", rev, err, last)
	}
	if r, err := s2.Put(ctx, "next", nil, 0); err != nil || r != last+1 {
		t.Fatalf("first Put after the crash = %d, %v; want revision %d", r, err, last+1)
	}
}

// TestTxnTornRecord: a crash in the middle of a transaction's journal
// append leaves none of it: its record fails its checksum and Open
// replays the records before it only.
func TestTxnTornRecord(t *testing.T) {
	s, path := openTemp(t)
	defer s.Close()
	r0 := txnMove(t, s, 0, 0)
	before := listAll(t, s)
	info, err := os.Stat(journalPath(path))
	if err != nil {
		t.Fatal(err)
	}
	txnMove(t, s, 1, r0)
	after, err := os.Stat(journalPath(path))
	if err != nil || after.Size() <= info.Size() {
		t.Fatalf("journal %d bytes before the transaction, %d after (%v)", info.Size(), after.Size(), err)
	}
	for _, cut := range []int64{info.Size() + journalHeader + 4, after.Size() - 1} {
		cp := crashCopy(t, path)
		if err := os.Truncate(journalPath(cp), cut); err != nil {
			t.Fatal(err)
		}
		s2, err := Open(cp, Options{})
		if err != nil {
			t.Fatalf("Open with the transaction's record cut at %d: %v", cut, err)
		}
		if diff := cmp.Diff(before, listAll(t, s2)); diff != "" {
			t.Errorf("cut at %d (-before the transaction +found):\n%s", cut, diff)
		}
		if rev, err := s2.Revision(t.Context()); err != nil || rev != r0 {
			t.Errorf("cut at %d: Revision = %d, %v; want %d", cut, rev, err, r0)
		}
		s2.Close()
	}
}

// TestTxnCrashDuringFold: bbolt has the fold of a round of transactions
// but the journal still holds the round: Open replays nothing twice (all
// of a transaction's entries are at or below bbolt's revision).
func TestTxnCrashDuringFold(t *testing.T) {
	s, path := openTemp(t)
	defer s.Close()
	var rev int64
	for i := range 10 {
		rev = txnMove(t, s, i, rev)
	}
	round, err := os.ReadFile(journalPath(path))
	if err != nil {
		t.Fatal(err)
	}
	foldNow(t, s)
	want := listAll(t, s)
	last, err := s.Revision(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cp := crashCopy(t, path)
	if err := os.WriteFile(journalPath(cp), round, 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(cp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("(-answered +after):\n%s", diff)
	}
	if r, err := s2.Put(t.Context(), "next", nil, 0); err != nil || r != last+1 {
		t.Fatalf("Put after = %d, %v; want %d", r, err, last+1)
	}
}

// TestTxnTooBigForJournal: a transaction in a batch too big for the
// journal is committed to bbolt directly (after a fold), still at one
// revision and published together.
func TestTxnTooBigForJournal(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	ctx := t.Context()
	a, err := s.Put(ctx, "big/a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "big/")
	if err != nil {
		t.Fatal(err)
	}
	folds := s.folds.Load()
	s.foldBytes = 1
	rev, err := s.Txn(ctx, []store.Op{
		{Kind: store.OpPut, Key: "big/b", Value: []byte("2")},
		{Kind: store.OpDelete, Key: "big/a", Rev: a},
	})
	s.foldBytes = foldBytes
	if err != nil {
		t.Fatal(err)
	}
	if s.folds.Load() == folds {
		t.Fatal("no fold: the transaction did not take the bbolt path")
	}
	got := []store.Event{<-w, <-w}
	want := []store.Event{
		{Type: store.EventPut, KV: store.KV{Key: "big/b", Value: []byte("2"), Revision: rev}},
		{Type: store.EventDelete, KV: store.KV{Key: "big/a", Revision: rev}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if _, err := s.Get(ctx, "big/a"); !isNotFound(err) {
		t.Fatalf("big/a after the transaction: %v", err)
	}
	if kv, err := s.Get(ctx, "big/b"); err != nil || kv.Revision != rev {
		t.Fatalf("big/b after the transaction: %+v, %v; want revision %d", kv, err, rev)
	}
}

// TestJournalSameRevFirstIsTorn: a record whose first entry claims the
// revision of an entry before it is not a record this package writes:
// the replay stops at it.
func TestJournalSameRevFirstIsTorn(t *testing.T) {
	j := &journal{}
	good := j.encode(5, []jChange{{key: "a", value: []byte("1")}, {key: "b", deleted: true, sameRev: true}})
	rec, ok := decodeJournalPayload(good[journalHeader:])
	if !ok || rec.first != 5 || rec.last != 5 || len(rec.changes) != 2 || !rec.changes[1].sameRev || !rec.changes[1].deleted {
		t.Fatalf("decoded %+v, %v", rec, ok)
	}
	bad := j.encode(5, []jChange{{key: "a", value: []byte("1"), sameRev: true}})
	if _, ok := decodeJournalPayload(bad[journalHeader:]); ok {
		t.Fatal("a record starting with a same-revision entry was decoded")
	}
}
