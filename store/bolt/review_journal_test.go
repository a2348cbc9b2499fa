package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
)

// Review of the journal (f77055a): behaviour the journal must keep, checked
// as it is.

// TestReviewReadsMergeOverlay: keys in bbolt only, in the overlay only, in
// both (rewritten), and deleted after a fold (tombstone over bbolt) read
// the same through Get, List, ListRevision and Snapshot, in key order,
// and CAS against each behaves as without the journal.
func TestReviewReadsMergeOverlay(t *testing.T) {
	ctx := t.Context()
	s, _ := openTemp(t)
	defer s.Close()
	put := func(k, v string, rev int64) int64 {
		t.Helper()
		r, err := s.Put(ctx, k, []byte(v), rev)
		if err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
		return r
	}
	rb := put("p/b", "bolt", 0)
	rd := put("p/d", "bolt-del", 0)
	rc := put("p/c", "bolt-then-ov", 0)
	put("q/x", "other prefix", 0)
	s.ovMu.RLock()
	inOv := len(s.ov)
	s.ovMu.RUnlock()
	if inOv == 0 {
		t.Fatal("nothing in the overlay after journaled Puts")
	}
	foldNow(t, s)
	if s.ovLen() != 0 {
		t.Fatalf("overlay holds %d after a fold", s.ovLen())
	}
	put("p/a", "ov", 0)
	rc2 := put("p/c", "ov-new", rc)
	if err := s.Delete(ctx, "p/d", rd); err != nil {
		t.Fatal(err)
	}
	re := put("p/e", "ov", 0)
	if s.ovLen() == 0 {
		t.Fatal("the second round is not in the overlay")
	}
	want := []string{"p/a=ov", "p/b=bolt", "p/c=ov-new", "p/e=ov"}
	kvs, rev, err := s.ListRevision(ctx, "p/")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, kvStrings(kvs)); diff != "" {
		t.Errorf("ListRevision (-want +got):\n%s", diff)
	}
	if rev != re {
		t.Errorf("ListRevision rev = %d, want %d", rev, re)
	}
	srev, all, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(append(append([]string{}, want...), "q/x=other prefix", "zz-fold/0="), kvStrings(all)); diff != "" || srev != re {
		t.Errorf("Snapshot rev %d (want %d) (-want +got):\n%s", srev, re, diff)
	}
	if _, err := s.Get(ctx, "p/d"); !isNotFound(err) {
		t.Errorf("Get of a key deleted in the overlay = %v, want ErrNotFound", err)
	}
	// CAS against each kind of key.
	cases := map[string]struct {
		key  string
		rev  int64
		conf bool
	}{
		"bbolt key, right rev":          {key: "p/b", rev: rb},
		"overlay rewrite, stale rev":    {key: "p/c", rev: rc, conf: true},
		"overlay rewrite, right rev":    {key: "p/c", rev: rc2},
		"tombstone, create":             {key: "p/d", rev: 0},
		"overlay key, create conflicts": {key: "p/a", rev: 0, conf: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := s.Put(ctx, tc.key, []byte("cas"), tc.rev)
			if got := err != nil; got != tc.conf {
				t.Fatalf("Put(%s, rev %d) = %v, want conflict %v", tc.key, tc.rev, err, tc.conf)
			}
		})
	}
}

// TestReviewReadsDuringFolds: with folds every few commits, concurrent
// readers never see a created key vanish, a counter go back, or a
// ListRevision/Snapshot revision below a record it returned or below an
// earlier one; after Close and Open everything answered is there.
func TestReviewReadsDuringFolds(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	s.foldBytes = 2048 // many folds
	const writers, perWriter = 4, 150
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var readErr atomic.Value
	fail := func(format string, a ...any) { readErr.CompareAndSwap(nil, fmt.Sprintf(format, a...)) }
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lastN, lastRev, lastCount int64
			for {
				select {
				case <-stop:
					return
				default:
				}
				var kvs []store.KV
				var rev int64
				var err error
				if r == 2 {
					rev, kvs, err = s.Snapshot(ctx)
				} else {
					kvs, rev, err = s.ListRevision(ctx, "")
				}
				if err != nil {
					fail("read: %v", err)
					return
				}
				if rev < lastRev {
					fail("revision went back %d -> %d", lastRev, rev)
				}
				lastRev = rev
				var keys int64
				for _, kv := range kvs {
					if kv.Revision > rev {
						fail("%s at %d above the read revision %d", kv.Key, kv.Revision, rev)
					}
					if strings.HasPrefix(kv.Key, "k/") {
						keys++
					}
				}
				if keys < lastCount {
					fail("created keys went from %d to %d", lastCount, keys)
				}
				lastCount = keys
				if kv, err := s.Get(ctx, "counter"); err == nil {
					var n int64
					fmt.Sscan(string(kv.Value), &n)
					if n < lastN {
						fail("counter went back %d -> %d", lastN, n)
					}
					lastN = n
				}
			}
		}()
	}
	var ww sync.WaitGroup
	for w := range writers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for i := range perWriter {
				if _, err := s.Put(ctx, fmt.Sprintf("k/%d/%04d", w, i), []byte(strings.Repeat("v", 40)), 0); err != nil {
					fail("put: %v", err)
					return
				}
				if _, err := s.Update(ctx, "counter", func(cur store.KV, ok bool) ([]byte, bool, error) {
					var n int64
					if ok {
						fmt.Sscan(string(cur.Value), &n)
					}
					return []byte(fmt.Sprint(n + 1)), false, nil
				}); err != nil {
					fail("update: %v", err)
					return
				}
			}
		}()
	}
	ww.Wait()
	close(stop)
	wg.Wait()
	if e := readErr.Load(); e != nil {
		t.Fatal(e)
	}
	if s.folds.Load() < 5 {
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
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("after Close and Open (-before +after):\n%s", diff)
	}
	if kv, _ := s2.Get(ctx, "counter"); string(kv.Value) != fmt.Sprint(writers*perWriter) {
		t.Fatalf("counter = %s, want %d", kv.Value, writers*perWriter)
	}
}

// TestReviewCrashDuringFold: bbolt has the fold's transaction but the
// journal still holds the whole round (the crash came before the
// truncation): Open replays nothing twice and the revision goes on.
func TestReviewCrashDuringFold(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	var last int64
	for i := range 50 {
		r, err := s.Put(ctx, fmt.Sprintf("k/%02d", i), []byte("v"), 0)
		if err != nil {
			t.Fatal(err)
		}
		last = r
	}
	kv, _ := s.Get(ctx, "k/07")
	if err := s.Delete(ctx, "k/07", kv.Revision); err != nil {
		t.Fatal(err)
	}
	last++
	roundJournal, err := os.ReadFile(journalPath(path))
	if err != nil || len(roundJournal) == 0 {
		t.Fatalf("journal: %d bytes, %v", len(roundJournal), err)
	}
	foldNow(t, s)
	last++
	want := listAll(t, s)
	cp := crashCopy(t, path) // bbolt after the fold
	if err := os.WriteFile(journalPath(cp), roundJournal, 0o600); err != nil {
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
	if r, err := s2.Put(ctx, "next", nil, 0); err != nil || r != last+1 {
		t.Fatalf("Put after = %d, %v; want %d", r, err, last+1)
	}
}

// TestReviewJournalFile: the journal sits beside the store file, 0600
// whatever the umask, and is empty after Close (everything folded), so a
// reader of corral.db alone (tests grepping it, the store size figure)
// sees every record only after a clean Close.
func TestReviewJournalFile(t *testing.T) {
	s, path := openTemp(t)
	if _, err := s.Put(t.Context(), "a", []byte("secret-ish"), 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(journalPath(path))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(journalPath(path)) != filepath.Dir(path) || fi.Mode().Perm() != 0o600 {
		t.Errorf("journal %s mode %v", journalPath(path), fi.Mode().Perm())
	}
	db, _ := os.ReadFile(path)
	if strings.Contains(string(db), "secret-ish") {
		t.Log("the value reached corral.db before a fold (bbolt page reuse?)")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(journalPath(path))
	db, _ = os.ReadFile(path)
	if fi.Size() != fileHeader || !strings.Contains(string(db), "secret-ish") {
		t.Fatalf("after Close: journal %d bytes, value in corral.db %v", fi.Size(), strings.Contains(string(db), "secret-ish"))
	}
}

// foldNow makes the committer fold: with foldBytes at 1 the next write
// is too big for the journal, so the overlay is folded and that write
// ("zz-fold/<n>") goes to bbolt directly.
func foldNow(t *testing.T, s *Store) {
	t.Helper()
	before := s.folds.Load()
	old := s.foldBytes
	s.foldBytes = 1
	if _, err := s.Put(context.Background(), fmt.Sprintf("zz-fold/%d", before), nil, 0); err != nil {
		t.Fatal(err)
	}
	s.foldBytes = old
	if s.folds.Load() == before {
		t.Fatal("no fold")
	}
}

func (s *Store) ovLen() int {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	return len(s.ov)
}

func kvStrings(kvs []store.KV) []string {
	out := []string{}
	for _, kv := range kvs {
		out = append(out, kv.Key+"="+string(kv.Value))
	}
	return out
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
