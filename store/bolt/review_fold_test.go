package bolt

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

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
			if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
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
			if diff := cmp.Diff(want, listAll(t, s3)); diff != "" {
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
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Fatalf("records (-answered +found):\n%s", diff)
	}
	all := listAll(t, s)
	s2, err := Open(crashCopy(t, path), Options{})
	if err != nil {
		t.Fatalf("Open after a crash: %v", err)
	}
	if diff := cmp.Diff(all, listAll(t, s2)); diff != "" {
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
	if diff := cmp.Diff(all, listAll(t, s3)); diff != "" {
		t.Fatalf("after Close and Open (-before +after):\n%s", diff)
	}
}
