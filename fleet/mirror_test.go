package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/google/go-cmp/cmp"
)

// pagedStore is a mem store that records how a mirror reads it and
// changes records before the second page of its read.
type pagedStore struct {
	*mem.Store
	between func() // run once, before the second page

	mu       sync.Mutex
	maxLimit int
	whole    int // List and ListRevision calls
	once     sync.Once
}

func (p *pagedStore) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	p.mu.Lock()
	p.maxLimit = max(p.maxLimit, limit)
	p.mu.Unlock()
	if startAfter != "" {
		p.once.Do(p.between)
	}
	return p.Store.ListPage(ctx, prefix, startAfter, limit)
}

func (p *pagedStore) List(ctx context.Context, prefix string) ([]store.KV, error) {
	p.mu.Lock()
	p.whole++
	p.mu.Unlock()
	return p.Store.List(ctx, prefix)
}

func (p *pagedStore) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	p.mu.Lock()
	p.whole++
	p.mu.Unlock()
	return p.Store.ListRevision(ctx, prefix)
}

// plainPaged is a pagedStore without history (Watch, then the read).
type plainPaged struct{ *pagedStore }

func (p plainPaged) WatchFrom() {} // hides mem's WatchFrom: not a store.HistoryWatcher

// TestMirrorReadsPages: the mirror reads its prefix a page at a time,
// never whole, and a record changed, deleted or created between two pages
// ends up mirrored as it is in the store; the bound still holds.
func TestMirrorReadsPages(t *testing.T) {
	const prefix = "/test/things/"
	for name, history := range map[string]bool{"with history": true, "without history": false} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var inner *mem.Store
			if history {
				inner = mem.NewWithHistory(1<<14, 64<<20)
			} else {
				inner = mem.New()
			}
			put := func(name, v string, rev int64) int64 {
				r, err := inner.Put(ctx, prefix+name, []byte(v), rev)
				if err != nil {
					t.Error(err)
				}
				return r
			}
			want := map[string]string{}
			revs := map[string]int64{}
			n := 2*loadPage + 10
			for i := range n {
				k := fmt.Sprintf("t%05d", i)
				revs[k], want[k] = put(k, "v0", 0), "v0"
			}
			ps := &pagedStore{Store: inner, between: func() {
				put("t00000", "v1", revs["t00000"]) // on the first page, read already
				kv, err := inner.Get(ctx, prefix+"t01500")
				if err != nil {
					t.Error(err)
					return
				}
				if err := inner.Delete(ctx, kv.Key, kv.Revision); err != nil { // on the second page
					t.Error(err)
				}
				put("t02050", "v1", revs["t02050"]) // on the third
				put("t99999", "new", 0)             // after the last
			}}
			want["t00000"], want["t02050"], want["t99999"] = "v1", "v1", "new"
			delete(want, "t01500")
			var st store.Store = ps
			if !history {
				st = plainPaged{ps}
				if _, ok := store.AsHistoryWatcher(st); ok {
					t.Fatal("the store without history has WatchFrom")
				}
			}
			m := newMirror(st, prefix, "thing", n+10, slog.New(slog.DiscardHandler), func(b []byte) (string, error) { return string(b), nil })
			mctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- m.run(mctx) }()
			defer func() { cancel(); <-done }()
			if err := m.wait(ctx); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				items, _ := m.snapshot()
				got = make(map[string]string, len(items))
				for k, it := range items {
					got[k] = it.v
				}
				if cmp.Equal(want, got) {
					break
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("mirror (-want +got):\n%s", diff)
			}
			ps.mu.Lock()
			defer ps.mu.Unlock()
			if ps.whole != 0 || ps.maxLimit > loadPage {
				t.Errorf("%d whole-prefix reads, pages of up to %d records; want none and at most %d", ps.whole, ps.maxLimit, loadPage)
			}
		})
	}
}

// TestMirrorBound: a read past the bound keeps max records, says it is
// truncated and stops reading.
func TestMirrorBound(t *testing.T) {
	const prefix = "/test/things/"
	ctx := context.Background()
	ps := &pagedStore{Store: mem.New(), between: func() {}}
	for i := range loadPage + 5 {
		if _, err := ps.Put(ctx, fmt.Sprintf("%st%05d", prefix, i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	m := newMirror(store.Store(ps), prefix, "thing", 10, slog.New(slog.DiscardHandler), func(b []byte) (string, error) { return string(b), nil })
	if _, err := m.load(ctx); err != nil {
		t.Fatal(err)
	}
	items, truncated := m.snapshot()
	if len(items) != 10 || !truncated {
		t.Errorf("%d records, truncated %v; want 10, true", len(items), truncated)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.maxLimit == 0 || ps.whole != 0 {
		t.Errorf("pages of up to %d, %d whole reads", ps.maxLimit, ps.whole)
	}
}
