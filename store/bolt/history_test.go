package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

// historyEvents is the ring size of the stores RunHistory opens: small, so
// compacting means writing a few dozen records.
const historyEvents = 64

func TestHistoryContract(t *testing.T) {
	storetest.RunHistory(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "corral.db"), Options{HistoryEvents: historyEvents})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, func(t *testing.T, s store.Store) {
		var wg sync.WaitGroup
		for i := range historyEvents + 1 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.Put(context.Background(), fmt.Sprintf("compact/%d", i), []byte("x"), 0); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	})
}

// TestHistoryAfterReopen: bbolt keeps no history, so after a restart
// nothing before the store's revision at Open can be resumed from, and
// everything after it can.
func TestHistoryAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	first, err := s.Put(ctx, "k/a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.Put(ctx, "k/b", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.WatchFrom(ctx, "k/", first)
	if !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("WatchFrom(%d) after reopen = %v, want ErrCompacted", first, err)
	}
	t.Logf("refusal: %v", err)
	ch, err := s.WatchFrom(ctx, "k/", last)
	if err != nil {
		t.Fatalf("WatchFrom the revision at Open: %v", err)
	}
	next, err := s.Put(ctx, "k/c", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.KV.Revision != next {
		t.Fatalf("got %+v, want k/c at %d", ev, next)
	}
}

// TestHistoryBytesBound: the ring also stops at its byte bound; a value
// larger than the whole bound is not remembered at all.
func TestHistoryBytesBound(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "corral.db"), Options{HistoryBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	r1, err := s.Put(ctx, "b/1", make([]byte, 1000), 0)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Put(ctx, "b/2", make([]byte, 1000), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WatchFrom(ctx, "b/", r1-1); err != nil {
		t.Fatalf("two small values fit: %v", err)
	}
	r3, err := s.Put(ctx, "b/3", make([]byte, 8000), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rev := range []int64{r1, r2} {
		if _, err := s.WatchFrom(ctx, "b/", rev); !errors.Is(err, store.ErrCompacted) {
			t.Errorf("WatchFrom(%d) after an oversized value = %v, want ErrCompacted", rev, err)
		}
	}
	if _, err := s.WatchFrom(ctx, "b/", r3); err != nil {
		t.Errorf("WatchFrom(%d) = %v", r3, err)
	}
}
