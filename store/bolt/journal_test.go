package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
)

// crashCopy copies the store file and its journal as a crash would leave
// them (what was written is in the files: the page cache survives a
// process crash) to a new directory and returns the copy's path. Nothing
// may be writing meanwhile.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "corral.db")
	for _, suffix := range []string{"", ".journal", ".journal.1"} {
		b, err := os.ReadFile(path + suffix)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func listAll(t *testing.T, s *Store) []store.KV {
	t.Helper()
	kvs, err := s.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	return kvs
}

// TestJournalCrash: every write answered before a crash is in the store
// after it, at its revision, whether it was still only in the journal or
// already folded into bbolt, and the revision goes on from there.
func TestJournalCrash(t *testing.T) {
	tests := map[string]struct {
		writes int
		tail   func(t *testing.T, journal string) // damage after the crash
	}{
		"journal only":           {writes: 100},
		"folded and journaled":   {writes: 2*foldEntries + 300},
		"torn last append":       {writes: 300, tail: func(t *testing.T, j string) { appendBytes(t, j, []byte{0x43, 0x4a, 0x52, 0x4e, 0, 0, 1, 0, 9}) }},
		"garbage after the tail": {writes: 300, tail: func(t *testing.T, j string) { appendBytes(t, j, make([]byte, 4096)) }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, path := openTemp(t)
			defer s.Close()
			ctx := t.Context()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var last int64
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < tc.writes; i += 8 {
						r, err := s.Put(ctx, fmt.Sprintf("k/%05d", i), []byte(fmt.Sprintf("v%d", i)), 0)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						last = max(last, r)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			// Rewrite and delete a few, so the journal holds more than
			// one change of a key.
			kv, _ := s.Get(ctx, "k/00003")
			r, err := s.Put(ctx, "k/00003", []byte("again"), kv.Revision)
			if err != nil {
				t.Fatal(err)
			}
			kv, _ = s.Get(ctx, "k/00004")
			if err := s.Delete(ctx, "k/00004", kv.Revision); err != nil {
				t.Fatal(err)
			}
			last = max(last, r) + 1
			want := listAll(t, s)
			if tc.writes > foldEntries && s.folds.Load() == 0 {
				t.Fatalf("%d writes and no fold", tc.writes)
			}
			cp := crashCopy(t, path)
			if tc.tail != nil {
				tc.tail(t, journalPath(cp))
			}
			s2, err := Open(cp, Options{})
			if err != nil {
				t.Fatalf("Open after the crash: %v", err)
			}
			defer s2.Close()
			if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
				t.Fatalf("records after the crash (-answered +found):\n%s", diff)
			}
			rev, err := s2.Revision(ctx)
			if err != nil || rev != last {
				t.Fatalf("Revision after the crash = %d, %v; want %d", rev, err, last)
			}
			if r, err := s2.Put(ctx, "next", []byte("n"), 0); err != nil || r != last+1 {
				t.Fatalf("first Put after the crash = %d, %v; want revision %d", r, err, last+1)
			}
		})
	}
}

func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

// TestJournalStaleRecordsAfterFold: records of an earlier round left in
// the journal (the truncation after a fold did not reach the disk) are
// not replayed over newer ones.
func TestJournalStaleRecordsAfterFold(t *testing.T) {
	s, path := openTemp(t)
	ctx := t.Context()
	r1, err := s.Put(ctx, "k", []byte("old"), 0)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(journalPath(path))
	if err != nil || len(old) == 0 {
		t.Fatalf("journal after a Put: %d bytes, %v", len(old), err)
	}
	if err := s.Close(); err != nil { // folds
		t.Fatal(err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Put(ctx, "k", []byte("new"), r1); err != nil {
		t.Fatal(err)
	}
	cp := crashCopy(t, path)
	// The old round's record behind the new one, and the old round alone
	// in front: neither may bring "old" back.
	cur, err := os.ReadFile(journalPath(cp))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"behind": append(append([]byte{}, cur...), old...), "alone": old} {
		t.Run(name, func(t *testing.T) {
			cp2 := crashCopy(t, cp)
			if err := os.WriteFile(journalPath(cp2), content, 0o600); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(cp2, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			kv, err := s2.Get(ctx, "k")
			wantVal := "new"
			if name == "alone" {
				wantVal = "old" // the new record is gone, bbolt still has old
			}
			if err != nil || string(kv.Value) != wantVal {
				t.Fatalf("Get = %q, %v; want %q", kv.Value, err, wantVal)
			}
		})
	}
}

// TestJournalGapIsCorrupt: a journal that starts above the store file's
// revision + 1 lost records in between: Open refuses it.
func TestJournalGapIsCorrupt(t *testing.T) {
	s, path := openTemp(t)
	if _, err := s.Put(t.Context(), "a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	cp := crashCopy(t, path)
	s.Close()
	j, err := os.ReadFile(journalPath(cp))
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite the record's first revision to 5 (the store file is at 0).
	p := j[fileHeader+journalHeader:]
	binary.BigEndian.PutUint64(p, 5)
	binary.BigEndian.PutUint32(j[fileHeader+8:], crc32.Checksum(p, castagnoli))
	if err := os.WriteFile(journalPath(cp), j, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(cp, Options{}); !errors.Is(err, store.ErrCorrupt) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open with a gap = %v, want ErrCorrupt", err)
	}
}

// TestJournalBigBatch: a write too big for the journal goes to bbolt
// directly, in revision order with the journaled ones around it.
func TestJournalBigBatch(t *testing.T) {
	s, path := openTemp(t)
	ctx := t.Context()
	if _, err := s.Put(ctx, "small", []byte("s"), 0); err != nil {
		t.Fatal(err)
	}
	s.foldBytes = 4096 // set before the committer sees a write of this size
	big := make([]byte, 5000)
	r, err := s.Put(ctx, "big", big, 0)
	if err != nil || r != 2 {
		t.Fatalf("big Put = %d, %v; want revision 2", r, err)
	}
	if r, err := s.Put(ctx, "after", []byte("a"), 0); err != nil || r != 3 {
		t.Fatalf("Put after the big one = %d, %v; want revision 3", r, err)
	}
	want := listAll(t, s)
	s2, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("records after the crash (-answered +found):\n%s", diff)
	}
	s.Close()
}

// TestNoJournalReplays: a store opened with NoJournal still replays a
// journal a crash left.
func TestNoJournalReplays(t *testing.T) {
	s, path := openTemp(t)
	if _, err := s.Put(t.Context(), "a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	cp := crashCopy(t, path)
	s.Close()
	s2, err := Open(cp, Options{NoJournal: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if kv, err := s2.Get(t.Context(), "a"); err != nil || string(kv.Value) != "1" {
		t.Fatalf("Get = %q, %v; want 1", kv.Value, err)
	}
}

// TestJournalOfAnotherStore: a journal holding records of another store
// file (corral.db deleted, or replaced by another store's file, while the
// journal stayed) is neither applied nor dropped: Open refuses it and
// names both files, and the journal is left as it was. A journal without
// records is taken over.
func TestJournalOfAnotherStore(t *testing.T) {
	withRecord := func(t *testing.T) string {
		s, path := openTemp(t)
		if _, err := s.Put(t.Context(), "old", []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		cp := crashCopy(t, path)
		s.Close()
		return cp
	}
	other := func(t *testing.T) string { // another store's file, at revision 1
		s, path := openTemp(t)
		if _, err := s.Put(t.Context(), "b", []byte("2"), 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tests := map[string]struct {
		setup   func(t *testing.T) string // returns the store path to open
		refused bool
	}{
		"store file deleted": {setup: func(t *testing.T) string {
			cp := withRecord(t)
			if err := os.Remove(cp); err != nil {
				t.Fatal(err)
			}
			return cp
		}, refused: true},
		"store file replaced by another store's": {setup: func(t *testing.T) string {
			cp := withRecord(t)
			b, err := os.ReadFile(other(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cp, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return cp
		}},
		"empty journal beside a new store file": {setup: func(t *testing.T) string {
			s, path := openTemp(t)
			if _, err := s.Put(t.Context(), "old", []byte("1"), 0); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil { // folds: the journal keeps its header only
				t.Fatal(err)
			}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return path
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := tc.setup(t)
			refused := tc.refused || name == "store file replaced by another store's"
			before, _ := os.ReadFile(journalPath(path))
			s, err := Open(path, Options{})
			if !refused {
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if kv, err := s.Get(t.Context(), "old"); err == nil {
					t.Fatalf("a new store holds %q from another store's journal", kv.Value)
				}
				return
			}
			if err == nil {
				kvs := listAll(t, s)
				s.Close()
				t.Fatalf("Open = nil with another store's journal; records %v", kvs)
			}
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "another store file") {
				t.Fatalf("Open = %v, want ErrCorrupt naming another store file", err)
			}
			after, _ := os.ReadFile(journalPath(path))
			if diff := cmp.Diff(before, after); diff != "" {
				t.Fatalf("the refused journal changed:\n%s", diff)
			}
		})
	}
}
