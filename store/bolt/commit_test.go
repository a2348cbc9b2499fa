package bolt

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/store"
)

// TestCommitEveryWriteAnswered: writers that commit their own batch when
// no one else is committing, and leave it to the committer goroutine when
// someone is, never leave a write unanswered: many writers, some with
// contexts that end while queued, some Updates of one hot key, all finish,
// and every answered write is in the store.
func TestCommitEveryWriteAnswered(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	writeEverywhere(t, s, 32, 150, 50*time.Microsecond, func(int, int) bool { return false })
}

// writeEverywhere runs writers goroutines of each writes on s: Puts of
// their own keys, an Update of one hot key before every fifth, a context
// that ends while the write is queued (after 0-2 steps) for every seventh,
// and WithCommitWindow where window(w, i). It fails t unless every write
// returns within 2 minutes, every answered Put is in the store, at least
// half were answered and no pending count is left behind; it returns the
// store's records.
func writeEverywhere(t *testing.T, s *Store, writers, each int, step time.Duration, window func(w, i int) bool) []store.KV {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := map[string]bool{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ctx := t.Context()
				if window(w, i) {
					ctx = store.WithCommitWindow(ctx)
				}
				var cancel context.CancelFunc = func() {}
				if i%7 == 3 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*step)
				}
				if i%5 == 0 {
					_, _ = s.Update(ctx, "hot", func(cur store.KV, _ bool) ([]byte, bool, error) {
						return append(cur.Value, 'x'), false, nil
					})
				}
				key := fmt.Sprintf("w%02d/%03d", w, i)
				if _, err := s.Put(ctx, key, []byte("v"), 0); err == nil {
					mu.Lock()
					answered[key] = true
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("writers still waiting after 2 minutes: a write was never committed")
	}
	all := listAll(t, s)
	got := map[string]bool{}
	for _, kv := range all {
		got[kv.Key] = true
	}
	for k := range answered {
		if !got[k] {
			t.Errorf("answered write %s is not in the store", k)
		}
	}
	if len(answered) < writers*each/2 {
		t.Errorf("only %d of %d writes answered without error", len(answered), writers*each)
	}
	if p := s.pending.Load(); p != 0 {
		t.Errorf("pending = %d after every write returned", p)
	}
	return all
}
