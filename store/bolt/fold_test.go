package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
)

// TestBackgroundFold: while a fold runs in the background, writes go on
// (into the other journal file), reads and compare-and-swaps see the
// frozen overlay, and a crash at either point of the fold (before its
// bbolt commit, or after it but before the frozen file is emptied) loses
// nothing answered. Both journal files take the active turn: the crash
// comes during the first fold and during the second.
func TestBackgroundFold(t *testing.T) {
	for _, stage := range []bool{false, true} {
		for _, round := range []int{1, 2} {
			name := fmt.Sprintf("fold %d crash before commit", round)
			if stage {
				name = fmt.Sprintf("fold %d crash after commit", round)
			}
			t.Run(name, func(t *testing.T) { testBackgroundFold(t, stage, round) })
		}
	}
}

func testBackgroundFold(t *testing.T, stage bool, round int) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	var last int64
	put := func(key, val string, rev int64) int64 {
		t.Helper()
		r, err := s.Put(ctx, key, []byte(val), rev)
		if err != nil {
			t.Fatalf("Put %s: %v", key, err)
		}
		last = r
		return r
	}
	n := 0
	fill := func() { // one more key than the overlay holds: a fold starts
		for range foldEntries + 1 {
			put(fmt.Sprintf("k/%05d", n), fmt.Sprintf("v%d", n), 0)
			n++
		}
	}
	if round == 2 {
		fill()
		waitFolds(t, s, 1)
	}
	reached, release := make(chan struct{}), make(chan struct{})
	s.foldHook = func(committed bool) {
		if committed == stage {
			close(reached)
			<-release
		}
	}
	fill()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("no background fold started")
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	// The fold is held: writes still commit, reads see the frozen keys.
	frozenKey := "k/00003"
	if round == 2 {
		frozenKey = fmt.Sprintf("k/%05d", foldEntries+10)
	}
	kv, err := s.Get(ctx, frozenKey)
	if err != nil {
		t.Fatalf("Get of a frozen key during the fold: %v", err)
	}
	if _, err := s.Put(ctx, frozenKey, []byte("stale"), kv.Revision-1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Put with a stale revision of a frozen key = %v, want ErrConflict", err)
	}
	put(frozenKey, "again", kv.Revision)
	gone := fmt.Sprintf("k/%05d", n-5)
	kv, _ = s.Get(ctx, gone)
	if err := s.Delete(ctx, gone, kv.Revision); err != nil {
		t.Fatalf("Delete of a frozen key during the fold: %v", err)
	}
	last++
	for i := range 40 {
		put(fmt.Sprintf("during/%02d", i), "d", 0)
	}
	want := listAll(t, s)
	if len(want) != n-1+40 {
		t.Fatalf("List during the fold: %d records, want %d", len(want), n-1+40)
	}
	if got, _ := s.Get(ctx, frozenKey); string(got.Value) != "again" {
		t.Fatalf("Get %s = %q, want again", frozenKey, got.Value)
	}
	if _, err := s.Get(ctx, gone); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a deleted frozen key = %v, want ErrNotFound", err)
	}

	// A crash now: both journal files hold records.
	cp := crashCopy(t, path)
	close(release)
	released = true
	waitFolds(t, s, int64(round))

	s2, err := Open(cp, Options{})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("records after the crash (-answered +found):\n%s", diff)
	}
	if r, err := s2.Put(ctx, "next", nil, 0); err != nil || r != last+1 {
		t.Fatalf("first Put after the crash = %d, %v; want revision %d", r, err, last+1)
	}
	s2.Close()
	// The running store finished its fold and lost nothing either.
	if diff := cmp.Diff(want, listAll(t, s)); diff != "" {
		t.Fatalf("records after the fold (-answered +found):\n%s", diff)
	}
	put("after", "a", 0)
	want = listAll(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if diff := cmp.Diff(want, listAll(t, s3)); diff != "" {
		t.Fatalf("records after Close and Open (-before +after):\n%s", diff)
	}
}

func waitFolds(t *testing.T, s *Store, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.folds.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d folds after 10 s, want %d", s.folds.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestJournalFilesChain: records of the second journal file that follow
// the first file's are replayed after them; a gap between the two files'
// records refuses Open.
func TestJournalFilesChain(t *testing.T) {
	s, path := openTemp(t)
	ctx := t.Context()
	for _, k := range []string{"a", "b"} {
		if _, err := s.Put(ctx, k, []byte(k), 0); err != nil {
			t.Fatal(err)
		}
	}
	cp := crashCopy(t, path)
	s.Close()
	j, err := os.ReadFile(journalPath(cp))
	if err != nil {
		t.Fatal(err)
	}
	// The first record (revision 1, key a) becomes key c at first
	// revision `at` in the second file.
	second := func(at int64) []byte {
		rec := append([]byte{}, j[:fileHeader]...)
		n := int(binary.BigEndian.Uint32(j[fileHeader+4:]))
		r := append([]byte{}, j[fileHeader:fileHeader+journalHeader+n]...)
		p := r[journalHeader:]
		binary.BigEndian.PutUint64(p, uint64(at))
		p[12+5] = 'c'
		binary.BigEndian.PutUint32(r[8:], crc32.Checksum(p, castagnoli))
		return append(rec, r...)
	}
	for name, tc := range map[string]struct {
		at      int64
		corrupt bool
	}{
		"follows":     {at: 3},
		"gap":         {at: 5, corrupt: true},
		"stale (old)": {at: 1},
	} {
		t.Run(name, func(t *testing.T) {
			c := crashCopy(t, cp)
			if err := os.WriteFile(journalPaths(c)[1], second(tc.at), 0o600); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(c, Options{})
			if tc.corrupt {
				if !errors.Is(err, store.ErrCorrupt) {
					if err == nil {
						s2.Close()
					}
					t.Fatalf("Open = %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			var keys []string
			for _, kv := range listAll(t, s2) {
				keys = append(keys, fmt.Sprintf("%s@%d", kv.Key, kv.Revision))
			}
			want := []string{"a@1", "b@2", "c@3"}
			if tc.at == 1 {
				want = want[:2]
			}
			if diff := cmp.Diff(want, keys); diff != "" {
				t.Fatalf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFoldRewindsJournal: a background fold empties the file it folded
// by rewinding it, not truncating it (its size stays: later rounds
// overwrite it in place, and an append that does not change a file's
// size needs no file-system journal commit); the next round's records
// over the old round's replay after a crash, and Close leaves both files
// with their header only.
func TestFoldRewindsJournal(t *testing.T) {
	ctx := t.Context()
	s, path := openTemp(t)
	defer s.Close()
	n := 0
	fill := func(count int) {
		for range count {
			if _, err := s.Put(ctx, fmt.Sprintf("k/%05d", n), []byte(fmt.Sprintf("value %d", n)), 0); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	fill(foldEntries + 1) // fold 1: file 0 frozen, file 1 active
	waitFolds(t, s, 1)
	size := func(i int) int64 {
		fi, err := os.Stat(journalPaths(path)[i])
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	folded := size(0)
	if folded < int64(foldEntries)*20 {
		t.Fatalf("file 0 after its fold: %d bytes, want its records kept in place (rewound, not truncated)", folded)
	}
	fill(foldEntries) // fold 2: file 1 frozen, file 0 active again
	waitFolds(t, s, 2)
	fill(10) // written over the start of file 0's first round
	if got := size(0); got != folded {
		t.Errorf("file 0 is %d bytes after 10 appends over its old round, want %d (unchanged)", got, folded)
	}
	want := listAll(t, s)
	cp := crashCopy(t, path)
	s2, err := Open(cp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
		t.Fatalf("after a crash (-answered +found):\n%s", diff)
	}
	s2.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := size(i); got != fileHeader {
			t.Errorf("journal file %d after Close: %d bytes, want the header only", i, got)
		}
	}
}
