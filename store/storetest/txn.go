package storetest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// The transaction's contract (store.Store's Txn): tests run by Run.

func put(key, value string, rev int64) store.Op {
	return store.Op{Kind: store.OpPut, Key: key, Value: []byte(value), Rev: rev}
}

func del(key string, rev int64) store.Op { return store.Op{Kind: store.OpDelete, Key: key, Rev: rev} }

func check(key string, rev int64) store.Op { return store.Op{Kind: store.OpCheck, Key: key, Rev: rev} }

func mustTxn(t *testing.T, s store.Store, ops ...store.Op) int64 {
	t.Helper()
	rev, err := s.Txn(ctxFor(t), ops)
	if err != nil {
		t.Fatalf("Txn(%v): %v", ops, err)
	}
	return rev
}

func listAll(t *testing.T, s store.Store, prefix string) []store.KV {
	t.Helper()
	kvs, err := s.List(ctxFor(t), prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return kvs
}

// wantNoEvents checks that nothing under ch's prefix changed before the
// fence write (a put of fenceKey, under the prefix): the next event must
// be the fence's.
func wantNoEvents(t *testing.T, s store.Store, ch <-chan store.Event, fenceKey string) {
	t.Helper()
	fence := mustPut(t, s, fenceKey, "fence", 0)
	if ev := recvN(t, ch, 1)[0]; ev.KV.Key != fenceKey || ev.KV.Revision != fence {
		t.Fatalf("event before the fence: %+v", ev)
	}
}

// testTxn: a transaction's puts, deletes and checks commit together at one
// new revision; a transaction of checks only writes nothing.
func testTxn(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx := ctxFor(t)
	a := mustPut(t, s, "t/a", "1", 0)
	gone := mustPut(t, s, "t/gone", "x", 0)
	kept := mustPut(t, s, "t/kept", "k", 0)

	val := []byte("n")
	ops := []store.Op{put("t/a", "2", a), {Kind: store.OpPut, Key: "t/new", Value: val}, del("t/gone", gone), check("t/kept", kept), check("t/absent", 0)}
	rev := mustTxn(t, s, ops...)
	if rev <= kept {
		t.Fatalf("Txn revision %d, want > %d", rev, kept)
	}
	copy(val, "X") // the caller reuses its buffer
	wantKV(t, s, "t/a", "2", rev)
	wantKV(t, s, "t/new", "n", rev)
	wantMissing(t, s, "t/gone")
	wantKV(t, s, "t/kept", "k", kept) // a check writes nothing
	wantMissing(t, s, "t/absent")

	// The next write gets a greater revision.
	if next := mustPut(t, s, "t/next", "1", 0); next <= rev {
		t.Fatalf("Put after the Txn: revision %d, want > %d", next, rev)
	}

	// Checks only: nothing is written, and the revision is the store's.
	w, err := s.Watch(ctx, "t/")
	if err != nil {
		t.Fatal(err)
	}
	before := listAll(t, s, "")
	cur := mustTxn(t, s, check("t/a", rev), check("t/kept", kept), check("t/gone", 0))
	if cur < rev {
		t.Fatalf("checks-only Txn revision %d, want at least %d", cur, rev)
	}
	if h, ok := store.AsHistoryWatcher(s); ok {
		if now, err := h.Revision(ctx); err != nil || now < cur {
			t.Fatalf("Revision after a checks-only Txn = %d, %v; want at least its %d", now, err, cur)
		}
	}
	if diff := cmp.Diff(before, listAll(t, s, ""), equateEmpty); diff != "" {
		t.Fatalf("a checks-only Txn changed the store (-before +after):\n%s", diff)
	}
	wantNoEvents(t, s, w, "t/fence")
}

// testTxnPreconditions: one failing precondition anywhere in a transaction
// fails all of it, with an error wrapping store.ErrConflict that names the
// (first) failing key, and nothing changes.
func testTxnPreconditions(t *testing.T, open func(t *testing.T) store.Store) {
	// The store holds t/k (created at old, updated at cur) and t/p (at
	// p); t/missing does not exist. Every case also creates t/new,
	// updates t/p and deletes nothing else, so a partial commit shows.
	type revs struct{ old, cur, p int64 }
	tests := map[string]struct {
		ops  func(r revs) []store.Op
		name string // the key the error must name
	}{
		"put at a stale revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/p", "2", r.p), put("t/k", "3", r.old)}
			},
			name: "t/k",
		},
		"put at a future revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/k", "3", r.cur+1000), put("t/new", "n", 0), put("t/p", "2", r.p)}
			},
			name: "t/k",
		},
		"create of an existing key": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/k", "3", 0), put("t/p", "2", r.p)}
			},
			name: "t/k",
		},
		"put of a missing key at a revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/p", "2", r.p), put("t/missing", "3", r.cur)}
			},
			name: "t/missing",
		},
		"delete of a missing key": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), del("t/missing", r.cur), put("t/p", "2", r.p)}
			},
			name: "t/missing",
		},
		"delete at a stale revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/p", "2", r.p), del("t/k", r.old)}
			},
			name: "t/k",
		},
		"check at a stale revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/p", "2", r.p), check("t/k", r.old)}
			},
			name: "t/k",
		},
		"check that an existing key is absent": {
			ops: func(r revs) []store.Op {
				return []store.Op{check("t/k", 0), put("t/new", "n", 0), put("t/p", "2", r.p)}
			},
			name: "t/k",
		},
		"check of a missing key at a revision": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), check("t/missing", r.cur), put("t/p", "2", r.p)}
			},
			name: "t/missing",
		},
		"the first of two failures is named": {
			ops: func(r revs) []store.Op {
				return []store.Op{put("t/new", "n", 0), put("t/p", "2", r.old), put("t/k", "3", r.old)}
			},
			name: "t/p",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			var r revs
			r.old = mustPut(t, s, "t/k", "1", 0)
			r.cur = mustPut(t, s, "t/k", "2", r.old)
			r.p = mustPut(t, s, "t/p", "1", 0)
			before := listAll(t, s, "")
			w, err := s.Watch(ctxFor(t), "t/")
			if err != nil {
				t.Fatal(err)
			}
			rev, err := s.Txn(ctxFor(t), tc.ops(r))
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("Txn = %d, %v; want an error wrapping ErrConflict", rev, err)
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Errorf("error %q does not name %q", err, tc.name)
			}
			if diff := cmp.Diff(before, listAll(t, s, ""), equateEmpty); diff != "" {
				t.Fatalf("a failed Txn changed the store (-before +after):\n%s", diff)
			}
			wantNoEvents(t, s, w, "t/fence")
		})
	}
}

// testTxnInvalid: a transaction of the wrong shape (store.CheckTxn) is
// refused with apierr.ErrInvalid and changes nothing.
func testTxnInvalid(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	k := mustPut(t, s, "t/k", "1", 0)
	var tooMany []store.Op
	for i := range store.MaxTxnOps + 1 {
		tooMany = append(tooMany, put(fmt.Sprintf("t/many/%03d", i), "v", 0))
	}
	tests := map[string][]store.Op{
		"nil":               nil,
		"empty":             {},
		"a key twice":       {put("t/new", "n", 0), check("t/k", k), put("t/new", "m", 0)},
		"a put and a check": {put("t/k", "2", k), check("t/k", k)},
		"too many":          tooMany,
		"kind zero":         {put("t/new", "n", 0), {Key: "t/k", Rev: k}},
		"unknown kind":      {put("t/new", "n", 0), {Kind: 99, Key: "t/k", Rev: k}},
		"delete at 0":       {put("t/new", "n", 0), del("t/k", 0)},
		"an empty key":      {put("t/new", "n", 0), put("", "e", 0)},
	}
	before := listAll(t, s, "")
	w, err := s.Watch(ctxFor(t), "t/")
	if err != nil {
		t.Fatal(err)
	}
	for name, ops := range tests {
		t.Run(name, func(t *testing.T) {
			rev, err := s.Txn(ctxFor(t), ops)
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("Txn = %d, %v; want an error of class apierr.ErrInvalid", rev, err)
			}
			if errors.Is(err, store.ErrConflict) {
				t.Fatalf("Txn error %v is a conflict too", err)
			}
		})
	}
	if diff := cmp.Diff(before, listAll(t, s, ""), equateEmpty); diff != "" {
		t.Fatalf("refused transactions changed the store (-before +after):\n%s", diff)
	}
	wantNoEvents(t, s, w, "t/fence")
	// MaxTxnOps operations are allowed.
	mustTxn(t, s, tooMany[:store.MaxTxnOps]...)
	if got := len(listAll(t, s, "t/many/")); got != store.MaxTxnOps {
		t.Fatalf("a Txn of %d creates left %d keys", store.MaxTxnOps, got)
	}
}

// testTxnWatch: a watcher sees the writes of one transaction as
// consecutive events at its revision, in the order of its ops (not of
// its keys), and only those under its prefix.
func testTxnWatch(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx := ctxFor(t)
	w, err := s.Watch(ctx, "w/")
	if err != nil {
		t.Fatal(err)
	}
	r1 := mustTxn(t, s, put("w/z", "1", 0), put("elsewhere", "x", 0), put("w/a", "1", 0))
	r2 := mustTxn(t, s, check("elsewhere", r1), del("w/z", r1), put("w/m", "1", 0), put("w/a", "2", r1))
	fence := mustPut(t, s, "w/fence", "end", 0)
	if r2 <= r1 || fence <= r2 {
		t.Fatalf("revisions %d, %d, %d do not increase", r1, r2, fence)
	}
	want := []store.Event{
		{Type: store.EventPut, KV: store.KV{Key: "w/z", Value: []byte("1"), Revision: r1}},
		{Type: store.EventPut, KV: store.KV{Key: "w/a", Value: []byte("1"), Revision: r1}},
		{Type: store.EventDelete, KV: store.KV{Key: "w/z", Revision: r2}},
		{Type: store.EventPut, KV: store.KV{Key: "w/m", Value: []byte("1"), Revision: r2}},
		{Type: store.EventPut, KV: store.KV{Key: "w/a", Value: []byte("2"), Revision: r2}},
		{Type: store.EventPut, KV: store.KV{Key: "w/fence", Value: []byte("end"), Revision: fence}},
	}
	if diff := cmp.Diff(want, recvN(t, w, len(want)), equateEmpty); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// testTxnConcurrent: goroutines move tokens between keys with
// transactions (take one from a key, give it to another, while checking
// a third is unchanged) as a reader lists the keys; every list sees the
// total unchanged, and so does the end.
func testTxnConcurrent(t *testing.T, open func(t *testing.T) store.Store) {
	const (
		keys    = 5
		tokens  = 20 // per key at the start
		workers = 6
		moves   = 15 // per worker
	)
	s := open(t)
	ctx := ctxFor(t)
	key := func(i int) string { return fmt.Sprintf("tok/%d", i) }
	for i := range keys {
		mustPut(t, s, key(i), strconv.Itoa(tokens), 0)
	}
	total := func(kvs []store.KV) (int, error) {
		n := 0
		for _, kv := range kvs {
			v, err := strconv.Atoi(string(kv.Value))
			if err != nil || v < 0 {
				return 0, fmt.Errorf("%s = %q", kv.Key, kv.Value)
			}
			n += v
		}
		if len(kvs) != keys {
			return n, fmt.Errorf("%d keys, want %d", len(kvs), keys)
		}
		return n, nil
	}
	read := func(k string) (int, int64, error) {
		kv, err := s.Get(ctx, k)
		if err != nil {
			return 0, 0, err
		}
		n, err := strconv.Atoi(string(kv.Value))
		return n, kv.Revision, err
	}
	move := func(from, to, witness string) (int64, error) {
		for {
			n, fr, err := read(from)
			if err != nil {
				return 0, err
			}
			m, tr, err := read(to)
			if err != nil {
				return 0, err
			}
			_, wr, err := read(witness)
			if err != nil {
				return 0, err
			}
			if n == 0 {
				return 0, nil // nothing to take: a move that does nothing
			}
			rev, err := s.Txn(ctx, []store.Op{put(from, strconv.Itoa(n-1), fr), put(to, strconv.Itoa(m+1), tr), check(witness, wr)})
			if errors.Is(err, store.ErrConflict) {
				continue
			}
			return rev, err
		}
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		revs = map[int64]bool{}
		done = make(chan struct{})
	)
	for w := range workers {
		wg.Go(func() {
			for i := range moves {
				from, to, witness := key((w+i)%keys), key((w+2*i+1)%keys), key((w+3*i+2)%keys)
				if from == to || to == witness || from == witness {
					to, witness = key((w+i+1)%keys), key((w+i+2)%keys)
				}
				rev, err := move(from, to, witness)
				if err != nil {
					t.Errorf("move %s -> %s: %v", from, to, err)
					return
				}
				if rev != 0 {
					mu.Lock()
					if revs[rev] {
						t.Errorf("two transactions committed at revision %d", rev)
					}
					revs[rev] = true
					mu.Unlock()
				}
			}
		})
	}
	var reader sync.WaitGroup
	reader.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			kvs, err := s.List(ctx, "tok/")
			if err != nil {
				t.Errorf("List: %v", err)
				return
			}
			if n, err := total(kvs); err != nil || n != keys*tokens {
				t.Errorf("a List during the moves saw %d tokens (%v), want %d: %v", n, err, keys*tokens, kvs)
				return
			}
		}
	})
	wg.Wait()
	close(done)
	reader.Wait()
	if n, err := total(listAll(t, s, "tok/")); err != nil || n != keys*tokens {
		t.Fatalf("after the moves: %d tokens (%v), want %d", n, err, keys*tokens)
	}
	if len(revs) == 0 {
		t.Fatal("no move committed")
	}
}
