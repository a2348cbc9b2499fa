package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// pagingStore is a mem store with history that records how the counts
// read it and changes records between two pages of the machines' read.
type pagingStore struct {
	*mem.Store
	between func() // run once, before the second page of machines

	mu       sync.Mutex
	maxLimit int
	whole    int // List and ListRevision calls
	once     sync.Once
}

func (p *pagingStore) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	p.mu.Lock()
	p.maxLimit = max(p.maxLimit, limit)
	p.mu.Unlock()
	if prefix == machinesPrefix && startAfter != "" {
		p.once.Do(p.between)
	}
	return p.Store.ListPage(ctx, prefix, startAfter, limit)
}

func (p *pagingStore) List(ctx context.Context, prefix string) ([]store.KV, error) {
	p.mu.Lock()
	p.whole++
	p.mu.Unlock()
	return p.Store.List(ctx, prefix)
}

func (p *pagingStore) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	p.mu.Lock()
	p.whole++
	p.mu.Unlock()
	return p.Store.ListRevision(ctx, prefix)
}

// TestStateCountsReadPages: the counts read the machines a page at a
// time, never the whole prefix, and a machine changed, deleted or created
// between two pages is counted as it ends up.
func TestStateCountsReadPages(t *testing.T) {
	for name, history := range map[string]bool{"with history": true, "without history": false} {
		t.Run(name, func(t *testing.T) {
			var inner *mem.Store
			if history {
				inner = mem.NewWithHistory(1<<14, 64<<20)
			} else {
				inner = mem.New()
			}
			n := 2*loadPage + loadPage/2
			revs := map[string]int64{}
			for i := range n {
				name := fmt.Sprintf("m%05d", i)
				revs[name] = putMachine(t, inner, name, inventoryv1.Machine_INVENTORIED, 0)
			}
			var st store.Store = &pagingStore{Store: inner, between: func() {
				// m00000 was read on the first page; m02000 is on the second;
				// m02400 on the third; m99999 sorts last.
				putMachine(t, inner, "m00000", inventoryv1.Machine_DEPLOYED, revs["m00000"])
				kv, err := inner.Get(context.Background(), machinesPrefix+"m02000")
				if err != nil {
					t.Error(err)
					return
				}
				if err := inner.Delete(context.Background(), kv.Key, kv.Revision); err != nil {
					t.Error(err)
				}
				putMachine(t, inner, "m02400", inventoryv1.Machine_FAILED, revs["m02400"])
				putMachine(t, inner, "m99999", inventoryv1.Machine_DISCOVERED, 0)
			}}
			if !history {
				st = noHistory{st}
			}
			c := newStateCounts(slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.run(ctx, st) }()
			defer func() { cancel(); <-done }()
			waitCounts(t, c, map[string]float64{
				"machines/INVENTORIED": float64(n - 3), "machines/DEPLOYED": 1, "machines/FAILED": 1, "machines/DISCOVERED": 1,
			})
			p := pagingStoreOf(st)
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.whole != 0 || p.maxLimit > loadPage {
				t.Errorf("%d whole-prefix reads, pages of up to %d records; want none and at most %d", p.whole, p.maxLimit, loadPage)
			}
		})
	}
}

// noHistory hides its store's optional interfaces but Pager (a store
// without history, as a plain Watch and List backend).
type noHistory struct{ store.Store }

func (n noHistory) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	return n.Store.(store.Pager).ListPage(ctx, prefix, startAfter, limit)
}

func pagingStoreOf(st store.Store) *pagingStore {
	if n, ok := st.(noHistory); ok {
		st = n.Store
	}
	return st.(*pagingStore)
}
