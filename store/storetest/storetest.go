// Package storetest is the contract test suite for store.Store
// implementations. It owns no implementation of its own: each backend's
// tests call Run with a constructor, and the suite checks the behaviour the
// store contract promises (compare-and-swap, store-wide revisions, listing,
// value copies, watches, Close, concurrent use and multi-key transactions).
//
// It imports nothing of Corral's except the store contract
// (github.com/corralhq/corral/store) and the error classes it names
// (internal/apierr).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralhq/corral/store"
)

// waitTimeout bounds every wait for a watch event or channel close.
const waitTimeout = 10 * time.Second

// equateEmpty treats nil and empty values alike: the contract does not
// distinguish them.
var equateEmpty = cmpopts.EquateEmpty()

// Run runs the contract suite. open must return a new, empty store each time
// it is called; it may be called from parallel subtests. The suite closes
// every store it opens (via t.Cleanup) unless the test closed it already.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) store.Store)
	}{
		{"GetMissing", testGetMissing},
		{"Create", testCreate},
		{"Preconditions", testPreconditions},
		{"RevisionsIncrease", testRevisionsIncrease},
		{"List", testList},
		{"ValuesAreCopies", testValuesAreCopies},
		{"Watch", testWatch},
		{"WatchCancel", testWatchCancel},
		{"Closed", testClosed},
		{"ConcurrentIncrements", testConcurrentIncrements},
		{"Updater", testUpdater},
		{"Txn", testTxn},
		{"TxnPreconditions", testTxnPreconditions},
		{"TxnInvalid", testTxnInvalid},
		{"TxnWatch", testTxnWatch},
		{"TxnConcurrent", testTxnConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, func(t *testing.T) store.Store {
				s := open(t)
				t.Cleanup(func() {
					if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
						t.Errorf("Close: %v", err)
					}
				})
				return s
			})
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// contentionCtx bounds the 1,000-write contention cases. They check that
// no increment is lost, not how fast one key can be written: on a
// replicated store each of the 1,000 rounds is a linearizable read and a
// write, and on a loaded two-core machine etcd's reads alone took ~200 ms
// (2026-11-29), past ctxFor's 30 seconds.
func contentionCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustPut(t *testing.T, s store.Store, key, value string, rev int64) int64 {
	t.Helper()
	got, err := s.Put(ctxFor(t), key, []byte(value), rev)
	if err != nil {
		t.Fatalf("Put(%q, %q, %d): %v", key, value, rev, err)
	}
	return got
}

func mustDelete(t *testing.T, s store.Store, key string, rev int64) {
	t.Helper()
	if err := s.Delete(ctxFor(t), key, rev); err != nil {
		t.Fatalf("Delete(%q, %d): %v", key, rev, err)
	}
}

// wantKV checks that key holds value at rev.
func wantKV(t *testing.T, s store.Store, key, value string, rev int64) {
	t.Helper()
	got, err := s.Get(ctxFor(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	want := store.KV{Key: key, Value: []byte(value), Revision: rev}
	if diff := cmp.Diff(want, got, equateEmpty); diff != "" {
		t.Fatalf("Get(%q) mismatch (-want +got):\n%s", key, diff)
	}
}

func wantMissing(t *testing.T, s store.Store, key string) {
	t.Helper()
	if _, err := s.Get(ctxFor(t), key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(%q) error = %v, want ErrNotFound", key, err)
	}
}

func testGetMissing(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	wantMissing(t, s, "nope")

	rev := mustPut(t, s, "gone", "v", 0)
	mustDelete(t, s, "gone", rev)
	wantMissing(t, s, "gone")
}

func testCreate(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	rev := mustPut(t, s, "k", "v1", 0)
	if rev <= 0 {
		t.Fatalf("create returned revision %d, want > 0", rev)
	}
	wantKV(t, s, "k", "v1", rev)

	// A key can be created again after it was deleted.
	mustDelete(t, s, "k", rev)
	rev2 := mustPut(t, s, "k", "v2", 0)
	if rev2 <= rev {
		t.Fatalf("re-create returned revision %d, want > %d", rev2, rev)
	}
	wantKV(t, s, "k", "v2", rev2)
}

// testPreconditions checks every compare-and-swap outcome against a store
// where "k" was created (revision old) and then updated (revision cur).
func testPreconditions(t *testing.T, open func(t *testing.T) store.Store) {
	type revChoice int
	const (
		revZero revChoice = iota
		revOld
		revCur
		revFuture
	)
	tests := []struct {
		name    string
		delete  bool
		key     string
		rev     revChoice
		wantErr error
	}{
		{name: "put create existing", key: "k", rev: revZero, wantErr: store.ErrConflict},
		{name: "put stale revision", key: "k", rev: revOld, wantErr: store.ErrConflict},
		{name: "put future revision", key: "k", rev: revFuture, wantErr: store.ErrConflict},
		{name: "put missing key with revision", key: "missing", rev: revCur, wantErr: store.ErrConflict},
		{name: "put current revision", key: "k", rev: revCur},
		{name: "put create missing", key: "missing", rev: revZero},
		{name: "delete stale revision", delete: true, key: "k", rev: revOld, wantErr: store.ErrConflict},
		{name: "delete zero revision", delete: true, key: "k", rev: revZero, wantErr: store.ErrConflict},
		{name: "delete future revision", delete: true, key: "k", rev: revFuture, wantErr: store.ErrConflict},
		{name: "delete missing", delete: true, key: "missing", rev: revCur, wantErr: store.ErrNotFound},
		{name: "delete missing zero revision", delete: true, key: "missing", rev: revZero, wantErr: store.ErrNotFound},
		{name: "delete current revision", delete: true, key: "k", rev: revCur},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			old := mustPut(t, s, "k", "v1", 0)
			cur := mustPut(t, s, "k", "v2", old)
			rev := map[revChoice]int64{revZero: 0, revOld: old, revCur: cur, revFuture: cur + 1000}[tc.rev]

			var newRev int64
			var err error
			if tc.delete {
				err = s.Delete(ctxFor(t), tc.key, rev)
			} else {
				newRev, err = s.Put(ctxFor(t), tc.key, []byte("v3"), rev)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
				// A failed write changes nothing.
				wantKV(t, s, "k", "v2", cur)
				wantMissing(t, s, "missing")
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			switch {
			case tc.delete:
				wantMissing(t, s, tc.key)
			default:
				if newRev <= cur {
					t.Fatalf("Put returned revision %d, want > %d", newRev, cur)
				}
				wantKV(t, s, tc.key, "v3", newRev)
			}
		})
	}
}

func testRevisionsIncrease(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	var last int64
	next := func(op string, rev int64) int64 {
		t.Helper()
		if rev <= last {
			t.Fatalf("%s: revision %d, want > %d", op, rev, last)
		}
		last = rev
		return rev
	}
	a := next("create a", mustPut(t, s, "a", "1", 0))
	b := next("create b", mustPut(t, s, "b", "1", 0))
	a = next("update a", mustPut(t, s, "a", "2", a))
	mustDelete(t, s, "b", b)
	b = next("re-create b", mustPut(t, s, "b", "2", 0))
	// A failed write does not disturb the sequence: the next successful
	// write still gets a greater revision.
	if _, err := s.Put(ctxFor(t), "a", []byte("x"), b+100); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale Put error = %v, want ErrConflict", err)
	}
	c := next("create c", mustPut(t, s, "c", "1", 0))

	// Revisions are store-wide: each record keeps the revision of its own
	// last write.
	wantKV(t, s, "a", "2", a)
	wantKV(t, s, "b", "2", b)
	wantKV(t, s, "c", "1", c)
}

func testList(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	revs := map[string]int64{}
	// Inserted out of order on purpose.
	for _, k := range []string{"b/1", "a/2", "ab", "a/10", "a", "B", "a/1", "gone/x"} {
		revs[k] = mustPut(t, s, k, "v:"+k, 0)
	}
	mustDelete(t, s, "gone/x", revs["gone/x"])

	kvs := func(keys ...string) []store.KV {
		out := []store.KV{}
		for _, k := range keys {
			out = append(out, store.KV{Key: k, Value: []byte("v:" + k), Revision: revs[k]})
		}
		return out
	}
	tests := []struct {
		prefix string
		want   []store.KV
	}{
		{prefix: "", want: kvs("B", "a", "a/1", "a/10", "a/2", "ab", "b/1")},
		{prefix: "a", want: kvs("a", "a/1", "a/10", "a/2", "ab")},
		{prefix: "a/", want: kvs("a/1", "a/10", "a/2")},
		{prefix: "a/1", want: kvs("a/1", "a/10")},
		{prefix: "ab", want: kvs("ab")},
		{prefix: "b", want: kvs("b/1")},
		{prefix: "gone/", want: kvs()},
		{prefix: "zzz", want: kvs()},
		{prefix: "a/100", want: kvs()},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("prefix=%q", tc.prefix), func(t *testing.T) {
			got, err := s.List(ctxFor(t), tc.prefix)
			if err != nil {
				t.Fatalf("List(%q): %v", tc.prefix, err)
			}
			if got == nil {
				t.Fatalf("List(%q) returned a nil slice, want an empty one", tc.prefix)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("List(%q) mismatch (-want +got):\n%s", tc.prefix, diff)
			}
		})
	}
}

func testValuesAreCopies(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx := ctxFor(t)

	in := []byte("original")
	rev, err := s.Put(ctx, "k", in, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(in, "XXXXXXXX") // the caller reuses its buffer
	wantKV(t, s, "k", "original", rev)

	got, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	copy(got.Value, "YYYYYYYY")
	wantKV(t, s, "k", "original", rev)

	list, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("List returned %d records, want 1", len(list))
	}
	copy(list[0].Value, "ZZZZZZZZ")
	wantKV(t, s, "k", "original", rev)

	// Two watchers of the same change must not share a value buffer, and
	// neither may alias the store.
	w1, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	rev = mustPut(t, s, "k", "second", rev)
	e1 := recvN(t, w1, 1)[0]
	e2 := recvN(t, w2, 1)[0]
	copy(e1.KV.Value, "WWWWWW")
	if string(e2.KV.Value) != "second" {
		t.Fatalf("second watcher saw value %q after the first one modified its copy", e2.KV.Value)
	}
	wantKV(t, s, "k", "second", rev)

	// The caller may reuse its buffer as soon as Put returns, before any
	// watcher has the event (record.Put encodes into pooled buffers):
	// the event must carry what was written, not what the buffer says
	// later.
	buf := []byte("third")
	rev, err = s.Put(ctx, "k", buf, rev)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "VVVVV")
	for _, w := range []<-chan store.Event{w1, w2} {
		if e := recvN(t, w, 1)[0]; string(e.KV.Value) != "third" {
			t.Fatalf("watch event value %q after the writer reused its buffer, want %q", e.KV.Value, "third")
		}
	}
	wantKV(t, s, "k", "third", rev)
}

// recvN receives exactly n events from ch.
func recvN(t *testing.T, ch <-chan store.Event, n int) []store.Event {
	t.Helper()
	var got []store.Event
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for len(got) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch channel closed after %d of %d events: %v", len(got), n, got)
			}
			got = append(got, ev)
		case <-timer.C:
			t.Fatalf("timed out after %d of %d events: %v", len(got), n, got)
		}
	}
	return got
}

// waitClosed drains ch until it is closed.
func waitClosed(t *testing.T, ch <-chan store.Event) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatal("watch channel not closed")
		}
	}
}

func testWatch(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx := ctxFor(t)

	// Changes before Watch returns are not replayed.
	before := mustPut(t, s, "w/before", "x", 0)

	ch, err := s.Watch(ctx, "w/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	other, err := s.Watch(ctx, "other/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	a1 := mustPut(t, s, "w/a", "1", 0)
	o1 := mustPut(t, s, "other/x", "1", 0)
	b1 := mustPut(t, s, "w/b", "1", 0)
	mustPut(t, s, "wx", "not under w/", 0)
	a2 := mustPut(t, s, "w/a", "2", a1)
	mustDelete(t, s, "w/b", b1)
	mustDelete(t, s, "w/before", before)
	mustDelete(t, s, "other/x", o1)
	// The last matching write is a fence: every event up to it must be
	// exactly the ones below, so nothing outside the prefix slipped in.
	fence := mustPut(t, s, "w/fence", "end", 0)

	got := recvN(t, ch, 6)
	want := []store.Event{
		{Type: store.EventPut, KV: store.KV{Key: "w/a", Value: []byte("1"), Revision: a1}},
		{Type: store.EventPut, KV: store.KV{Key: "w/b", Value: []byte("1"), Revision: b1}},
		{Type: store.EventPut, KV: store.KV{Key: "w/a", Value: []byte("2"), Revision: a2}},
		{Type: store.EventDelete, KV: store.KV{Key: "w/b"}},
		{Type: store.EventDelete, KV: store.KV{Key: "w/before"}},
		{Type: store.EventPut, KV: store.KV{Key: "w/fence", Value: []byte("end"), Revision: fence}},
	}
	// Delete revisions are not returned by Delete; they must sit strictly
	// between their neighbours.
	for i := range got {
		if i > 0 && got[i].KV.Revision <= got[i-1].KV.Revision {
			t.Errorf("event %d revision %d not greater than previous %d", i, got[i].KV.Revision, got[i-1].KV.Revision)
		}
		if got[i].Type == store.EventDelete {
			if got[i].KV.Value != nil {
				t.Errorf("delete event %d has value %q, want nil", i, got[i].KV.Value)
			}
			if i < len(want) && want[i].Type == store.EventDelete {
				want[i].KV.Revision = got[i].KV.Revision
			}
		}
	}
	if got[3].KV.Revision <= a2 {
		t.Errorf("delete revision %d not after the preceding put %d", got[3].KV.Revision, a2)
	}
	if diff := cmp.Diff(want, got, equateEmpty); diff != "" {
		t.Fatalf("events mismatch (-want +got):\n%s", diff)
	}

	gotOther := recvN(t, other, 2)
	if gotOther[0].Type != store.EventPut || gotOther[0].KV.Key != "other/x" || gotOther[0].KV.Revision != o1 ||
		gotOther[1].Type != store.EventDelete || gotOther[1].KV.Key != "other/x" || gotOther[1].KV.Revision <= o1 {
		t.Fatalf("other/ watcher got %v", gotOther)
	}
}

func testWatchCancel(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx, cancel := context.WithCancel(ctxFor(t))
	ch, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	mustPut(t, s, "k", "v", 0)
	recvN(t, ch, 1)
	cancel()
	waitClosed(t, ch)

	// The store keeps working, and other watchers are unaffected.
	ch2, err := s.Watch(ctxFor(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	mustPut(t, s, "k2", "v", 0)
	if ev := recvN(t, ch2, 1)[0]; ev.KV.Key != "k2" {
		t.Fatalf("got event for %q, want k2", ev.KV.Key)
	}

	// Watching with a context that already ended either fails or yields a
	// channel that closes.
	done, cancelDone := context.WithCancel(t.Context())
	cancelDone()
	if ch3, err := s.Watch(done, ""); err == nil {
		waitClosed(t, ch3)
	}
}

func testClosed(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	rev := mustPut(t, s, "k", "v", 0)
	ch, err := s.Watch(ctxFor(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitClosed(t, ch)

	ctx := ctxFor(t)
	tests := []struct {
		name string
		call func() error
	}{
		{"Get", func() error { _, err := s.Get(ctx, "k"); return err }},
		{"List", func() error { _, err := s.List(ctx, ""); return err }},
		{"Put", func() error { _, err := s.Put(ctx, "k", []byte("w"), rev); return err }},
		{"Put create", func() error { _, err := s.Put(ctx, "new", []byte("w"), 0); return err }},
		{"Delete", func() error { return s.Delete(ctx, "k", rev) }},
		{"Watch", func() error { _, err := s.Watch(ctx, ""); return err }},
		{"Close", s.Close},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, store.ErrClosed) {
				t.Fatalf("%s after Close: error = %v, want ErrClosed", tc.name, err)
			}
		})
	}
}

// testConcurrentIncrements has many goroutines increment one counter with
// read-modify-write compare-and-swap loops. Lost updates show up as a final
// count below the number of increments.
func testConcurrentIncrements(t *testing.T, open func(t *testing.T) store.Store) {
	const (
		workers    = 50
		increments = 20
		key        = "counter"
	)
	s := open(t)
	ctx := contentionCtx(t)
	mustPut(t, s, key, "0", 0)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for range increments {
				if err := increment(ctx, s, key); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	got, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != strconv.Itoa(workers*increments) {
		t.Fatalf("counter = %s, want %d", got.Value, workers*increments)
	}
}

func increment(ctx context.Context, s store.Store, key string) error {
	for {
		kv, err := s.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		n, err := strconv.Atoi(string(kv.Value))
		if err != nil {
			return fmt.Errorf("counter value %q: %w", kv.Value, err)
		}
		_, err = s.Put(ctx, key, []byte(strconv.Itoa(n+1)), kv.Revision)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrConflict):
			continue
		default:
			return fmt.Errorf("put: %w", err)
		}
	}
}

// testUpdater checks store.Updater, when the store implements it: create,
// modify, delete, an aborting fn, reads inside fn, and 50x20 concurrent
// increments of one key ending at exactly 1000.
func testUpdater(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	u, ok := s.(store.Updater)
	if !ok {
		t.Skip("store does not implement store.Updater")
	}
	ctx := contentionCtx(t)
	kv, err := u.Update(ctx, "u/a", func(cur store.KV, exists bool) ([]byte, bool, error) {
		if exists {
			t.Error("fn saw a missing key as existing")
		}
		return []byte("1"), false, nil
	})
	if err != nil || string(kv.Value) != "1" || kv.Revision == 0 {
		t.Fatalf("create: %+v %v", kv, err)
	}
	got, _ := s.Get(ctx, "u/a")
	if got.Revision != kv.Revision {
		t.Fatalf("Update revision %d, Get revision %d", kv.Revision, got.Revision)
	}
	abort := errors.New("abort")
	if _, err := u.Update(ctx, "u/a", func(cur store.KV, exists bool) ([]byte, bool, error) {
		if _, err := s.Get(ctx, "u/a"); err != nil { // reads are allowed inside fn
			t.Errorf("read inside fn: %v", err)
		}
		return nil, false, abort
	}); !errors.Is(err, abort) {
		t.Fatalf("aborting fn: %v", err)
	}
	if after, _ := s.Get(ctx, "u/a"); after.Revision != kv.Revision {
		t.Fatal("aborting fn changed the record")
	}
	if _, err := u.Update(ctx, "u/a", func(cur store.KV, exists bool) ([]byte, bool, error) { return nil, true, nil }); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := s.Get(ctx, "u/a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := u.Update(ctx, "u/a", func(cur store.KV, exists bool) ([]byte, bool, error) { return nil, true, nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete of a missing key: %v", err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := u.Update(ctx, "u/counter", func(cur store.KV, exists bool) ([]byte, bool, error) {
					n := 0
					if exists {
						n, _ = strconv.Atoi(string(cur.Value))
					}
					return []byte(strconv.Itoa(n + 1)), false, nil
				}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got, _ := s.Get(ctx, "u/counter"); string(got.Value) != "1000" {
		t.Fatalf("counter %q, want 1000", got.Value)
	}
}
