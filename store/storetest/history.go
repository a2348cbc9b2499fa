package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralhq/corral/store"
)

// RunHistory runs the contract of store.HistoryWatcher: ListRevision's
// revision, resuming with WatchFrom (exactly the missed events, in order,
// then live ones), refusals with store.ErrCompacted, and slow resumed
// watchers being disconnected without slowing writers.
//
// open must return a new, empty store implementing store.HistoryWatcher.
// compact must make every revision before the store's current one
// (after compact returns) impossible to resume from (etcd: compact; stores with a bounded ring:
// write enough elsewhere to push it out). The suite closes the stores.
func RunHistory(t *testing.T, open func(t *testing.T) store.Store, compact func(t *testing.T, s store.Store)) {
	t.Helper()
	tests := map[string]func(t *testing.T, s hstore, compact func(t *testing.T, s store.Store)){
		"ListRevision": testListRevision,
		"Resume":       testResume,
		"ResumeFuture": testResumeFuture,
		"ResumeSlow":   testResumeSlow,
		"ResumeCancel": testResumeCancel,
		"ResumeTxn":    testResumeTxn,
	}
	// The others run in parallel; compaction (cluster-wide on etcd) runs
	// alone after them.
	t.Run("group", func(t *testing.T) {
		for name, fn := range tests {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runHistoryCase(t, open, compact, fn)
			})
		}
	})
	t.Run("ResumeCompacted", func(t *testing.T) { runHistoryCase(t, open, compact, testResumeCompacted) })
}

func runHistoryCase(t *testing.T, open func(t *testing.T) store.Store, compact func(t *testing.T, s store.Store),
	fn func(t *testing.T, s hstore, compact func(t *testing.T, s store.Store))) {
	s := open(t)
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	h, ok := store.AsHistoryWatcher(s)
	if !ok {
		t.Fatalf("%T does not implement store.HistoryWatcher", s)
	}
	fn(t, hstore{Store: s, HistoryWatcher: h}, compact)
}

type hstore struct {
	store.Store
	store.HistoryWatcher
}

func testListRevision(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	ctx := ctxFor(t)
	kvs, rev, err := s.ListRevision(ctx, "l/")
	if err != nil || len(kvs) != 0 {
		t.Fatalf("ListRevision of an empty store = %v, %d, %v", kvs, rev, err)
	}
	a := mustPut(t, s, "l/a", "1", 0)
	b := mustPut(t, s, "l/b", "1", 0)
	other := mustPut(t, s, "x/other", "1", 0) // outside the prefix, yet the newest revision
	kvs, rev, err = s.ListRevision(ctx, "l/")
	if err != nil {
		t.Fatal(err)
	}
	want := []store.KV{{Key: "l/a", Value: []byte("1"), Revision: a}, {Key: "l/b", Value: []byte("1"), Revision: b}}
	if diff := cmp.Diff(want, kvs); diff != "" {
		t.Fatalf("ListRevision (-want +got):\n%s", diff)
	}
	cur, err := s.Revision(ctx)
	if err != nil || cur < rev {
		t.Fatalf("Revision = %d, %v; want at least the list's %d", cur, err, rev)
	}
	// On a store shared with others (etcd) the revision may have moved on.
	if rev < other {
		t.Fatalf("ListRevision revision %d, want at least the store's current revision %d", rev, other)
	}
	// List then WatchFrom the list's revision: the next change and only it.
	ch, err := s.WatchFrom(ctx, "l/", rev)
	if err != nil {
		t.Fatal(err)
	}
	c := mustPut(t, s, "l/c", "1", 0)
	if got := recvN(t, ch, 1)[0]; got.KV.Key != "l/c" || got.KV.Revision != c {
		t.Fatalf("first event after the list's revision: %+v, want l/c at %d", got, c)
	}
}

func testResume(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	ctx := ctxFor(t)
	var revs []int64
	for i := range 5 {
		revs = append(revs, mustPut(t, s, fmt.Sprintf("r/%d", i), "v", 0))
		mustPut(t, s, fmt.Sprintf("q/%d", i), "elsewhere", 0)
	}
	mustDelete(t, s, "r/1", revs[1])
	// Resume after r/2: r/3, r/4 and the delete of r/1, nothing of q/.
	ch, err := s.WatchFrom(ctx, "r/", revs[2])
	if err != nil {
		t.Fatal(err)
	}
	live := mustPut(t, s, "r/live", "now", 0)
	got := recvN(t, ch, 4)
	var keys []string
	for i, ev := range got {
		keys = append(keys, fmt.Sprintf("%d %s", ev.Type, ev.KV.Key))
		if i > 0 && ev.KV.Revision <= got[i-1].KV.Revision {
			t.Errorf("event %d at revision %d, not after %d", i, ev.KV.Revision, got[i-1].KV.Revision)
		}
	}
	want := []string{
		fmt.Sprintf("%d r/3", store.EventPut), fmt.Sprintf("%d r/4", store.EventPut),
		fmt.Sprintf("%d r/1", store.EventDelete), fmt.Sprintf("%d r/live", store.EventPut),
	}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Fatalf("resumed events (-want +got):\n%s", diff)
	}
	if got[0].KV.Revision != revs[3] || got[3].KV.Revision != live || string(got[3].KV.Value) != "now" {
		t.Fatalf("resumed events carry wrong revisions or values: %+v", got)
	}
	// Resuming at the current revision delivers only what comes next.
	ch2, err := s.WatchFrom(ctx, "r/", live)
	if err != nil {
		t.Fatal(err)
	}
	next := mustPut(t, s, "r/next", "x", 0)
	if ev := recvN(t, ch2, 1)[0]; ev.KV.Revision != next {
		t.Fatalf("resume at the current revision got %+v, want r/next at %d", ev, next)
	}
}

func testResumeCompacted(t *testing.T, s hstore, compact func(*testing.T, store.Store)) {
	ctx := ctxFor(t)
	first := mustPut(t, s, "c/a", "1", 0)
	mustPut(t, s, "c/b", "1", 0)
	compact(t, s.Store)
	_, err := s.WatchFrom(ctx, "c/", first)
	if !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("WatchFrom a compacted revision = %v, want ErrCompacted", err)
	}
	if !strings.Contains(err.Error(), "re-list") {
		t.Errorf("compacted error %q does not tell the caller to re-list", err)
	}
	// After a re-list the watch resumes fine.
	_, rev, err := s.ListRevision(ctx, "c/")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := s.WatchFrom(ctx, "c/", rev)
	if err != nil {
		t.Fatalf("WatchFrom the current revision after compaction: %v", err)
	}
	c := mustPut(t, s, "c/c", "1", 0)
	if ev := recvN(t, ch, 1)[0]; ev.KV.Revision != c {
		t.Fatalf("got %+v, want c/c at %d", ev, c)
	}
}

func testResumeFuture(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	cur := mustPut(t, s, "f/a", "1", 0)
	for _, rev := range []int64{cur + 1_000_000, -1} {
		if _, err := s.WatchFrom(ctxFor(t), "f/", rev); !errors.Is(err, store.ErrCompacted) {
			t.Errorf("WatchFrom(%d) with the store at %d = %v, want ErrCompacted", rev, cur, err)
		}
	}
}

// testResumeSlow: a resumed watcher that never reads is disconnected while
// concurrent writers finish; the events it did get are in order.
func testResumeSlow(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	ctx := ctxFor(t)
	start := mustPut(t, s, "s/start", "x", 0)
	ch, err := s.WatchFrom(ctx, "s/", start)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 150
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	begin := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := s.Put(ctx, fmt.Sprintf("s/%02d/%04d", w, i), []byte("v"), 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("writers blocked behind a watcher that does not read")
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d writes with a stalled watcher took %v", writers*each, time.Since(begin))
	// The stalled watcher got a prefix of the events and was then closed.
	n, last := 0, start
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				if n >= writers*each {
					t.Fatalf("watcher received all %d events; it was never disconnected", n)
				}
				return
			}
			// Writers running at once may share a revision (a backend's
			// group commit: store/etcd/group.go), never go back.
			if ev.KV.Revision < last {
				t.Fatalf("event at revision %d after %d", ev.KV.Revision, last)
			}
			last = ev.KV.Revision
			n++
		case <-timer.C:
			t.Fatalf("stalled watcher not disconnected (received %d of %d)", n, writers*each)
		}
	}
}

func testResumeCancel(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	start := mustPut(t, s, "x/a", "1", 0)
	ctx, cancel := context.WithCancel(ctxFor(t))
	ch, err := s.WatchFrom(ctx, "x/", start-1)
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, ch, 1)
	cancel()
	waitClosed(t, ch)
}

// testResumeTxn: the writes of one transaction share a revision; resuming
// before it delivers all of them in the order of its ops, resuming at it
// delivers none of them, and a watch opened at it goes on after it.
func testResumeTxn(t *testing.T, s hstore, _ func(*testing.T, store.Store)) {
	ctx := ctxFor(t)
	a := mustPut(t, s, "x/a", "1", 0)
	rev := mustTxn(t, s, put("x/z", "1", 0), put("y/outside", "1", 0), del("x/a", a), put("x/b", "1", 0))
	after := mustPut(t, s, "x/after", "1", 0)
	want := []store.Event{
		{Type: store.EventPut, KV: store.KV{Key: "x/z", Value: []byte("1"), Revision: rev}},
		{Type: store.EventDelete, KV: store.KV{Key: "x/a", Revision: rev}},
		{Type: store.EventPut, KV: store.KV{Key: "x/b", Value: []byte("1"), Revision: rev}},
		{Type: store.EventPut, KV: store.KV{Key: "x/after", Value: []byte("1"), Revision: after}},
	}
	for _, from := range []int64{a, rev - 1} {
		ch, err := s.WatchFrom(ctx, "x/", from)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, recvN(t, ch, len(want)), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("WatchFrom(%d) (-want +got):\n%s", from, diff)
		}
	}
	ch, err := s.WatchFrom(ctx, "x/", rev)
	if err != nil {
		t.Fatal(err)
	}
	if ev := recvN(t, ch, 1)[0]; ev.KV.Key != "x/after" || ev.KV.Revision != after {
		t.Fatalf("WatchFrom the transaction's revision %d: first event %+v, want x/after at %d", rev, ev, after)
	}
	// Live: a watch resumed before a transaction that commits later.
	live, err := s.WatchFrom(ctx, "x/", after)
	if err != nil {
		t.Fatal(err)
	}
	rev2 := mustTxn(t, s, put("x/b", "2", rev), put("x/c", "1", 0))
	got := recvN(t, live, 2)
	if got[0].KV.Key != "x/b" || got[1].KV.Key != "x/c" || got[0].KV.Revision != rev2 || got[1].KV.Revision != rev2 {
		t.Fatalf("live events of a transaction at %d: %+v", rev2, got)
	}
}
