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
	const writers, each = 32, 150
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := map[string]bool{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ctx := t.Context()
				var cancel context.CancelFunc = func() {}
				if i%7 == 3 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*50*time.Microsecond)
				}
				key := fmt.Sprintf("w%02d/%03d", w, i)
				if i%5 == 0 {
					_, err := s.Update(ctx, "hot", func(cur store.KV, _ bool) ([]byte, bool, error) {
						return append(cur.Value, 'x'), false, nil
					})
					if err == nil {
						mu.Lock()
						answered["hot+"] = true
						mu.Unlock()
					}
				}
				if _, err := s.Put(ctx, key, []byte("v"), 0); err == nil {
					mu.Lock()
					answered[key] = true
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("writers still waiting after 2 minutes: a write was never committed")
	}
	got := map[string]bool{}
	for _, kv := range listAll(t, s) {
		got[kv.Key] = true
	}
	for k := range answered {
		if k != "hot+" && !got[k] {
			t.Errorf("answered write %s is not in the store", k)
		}
	}
	if len(answered) < writers*each/2 {
		t.Errorf("only %d of %d writes answered without error", len(answered), writers*each)
	}
	if s.pending.Load() != 0 {
		t.Errorf("pending = %d after every write returned", s.pending.Load())
	}
}
