package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestGroupCommitShares: 600 writers at once through a store that admits 4
// requests at a time share transactions (fewer etcd transactions than
// writes), every write commits with the value it asked for at the revision
// it was told, and the writes of one transaction share one revision.
func TestGroupCommitShares(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/group", MaxInFlight: 4, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 600
	revs := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			revs[i], errs[i] = s.Put(ctx, fmt.Sprintf("/k/%03d", i), fmt.Appendf(nil, "v%d", i), 0)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	batches, units := s.GroupStats()
	t.Logf("%d writes in %d transactions (mean %.1f a transaction)", units, batches, float64(units)/float64(batches))
	if units != n || batches >= n {
		t.Fatalf("%d writes in %d transactions: want %d writes sharing fewer transactions", units, batches, n)
	}
	shared := map[int64]int{}
	for i := range n {
		kv, err := s.Get(ctx, fmt.Sprintf("/k/%03d", i))
		if err != nil || string(kv.Value) != fmt.Sprintf("v%d", i) || kv.Revision != revs[i] {
			t.Fatalf("key %d: %+v, %v; want v%d at %d", i, kv, err, i, revs[i])
		}
		shared[revs[i]]++
	}
	if len(shared) != int(batches) {
		t.Fatalf("%d distinct revisions for %d transactions", len(shared), batches)
	}
}

// TestGroupCommitConflictsStayTheirs: in batches where some writes' compares
// fail, exactly those fail (ErrConflict for a stale put or transaction,
// ErrNotFound for a delete of a missing key) and every other write of the
// same batches commits.
func TestGroupCommitConflictsStayTheirs(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/groupc", MaxInFlight: 4, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 300
	// Every third key exists already: a create of it must conflict.
	for i := 0; i < n; i += 3 {
		if _, err := s.Put(ctx, fmt.Sprintf("/c/%03d", i), []byte("old"), 0); err != nil {
			t.Fatal(err)
		}
	}
	stale := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("/c/%03d", i)
			switch i % 3 {
			case 0: // create of an existing key
				_, stale[i] = s.Put(ctx, key, []byte("new"), 0)
			case 1: // a transaction creating two keys
				_, stale[i] = s.Txn(ctx, []store.Op{{Kind: store.OpPut, Key: key, Value: []byte("new")}, {Kind: store.OpPut, Key: key + "/b", Value: []byte("new")}})
			case 2: // a delete of a missing key at a made-up revision
				stale[i] = s.Delete(ctx, key, 7)
			}
		})
	}
	wg.Wait()
	for i, err := range stale {
		key := fmt.Sprintf("/c/%03d", i)
		switch i % 3 {
		case 0:
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("create of existing %s: %v, want ErrConflict", key, err)
			}
			if kv, _ := s.Get(ctx, key); string(kv.Value) != "old" {
				t.Fatalf("%s = %q after a refused create", key, kv.Value)
			}
		case 1:
			if err != nil {
				t.Fatalf("transaction on %s: %v", key, err)
			}
			a, _ := s.Get(ctx, key)
			b, _ := s.Get(ctx, key+"/b")
			if string(a.Value) != "new" || string(b.Value) != "new" || a.Revision != b.Revision {
				t.Fatalf("transaction on %s: %+v %+v: want both written at one revision", key, a, b)
			}
		case 2:
			if !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("delete of missing %s: %v, want ErrNotFound", key, err)
			}
		}
	}
	batches, units := s.GroupStats()
	t.Logf("%d units in %d transactions", units, batches)
}

// TestGroupCommitOneKeyTakesTurns: writers racing on one key through
// compare-and-swap never both win a revision (two units on one key are
// never judged in one batch) and the counter ends exact.
func TestGroupCommitOneKeyTakesTurns(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/groupk", MaxInFlight: 4, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Put(ctx, "/n", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	// 20 writers each try to move the key from the revision they all read:
	// exactly one may win.
	kv, _ := s.Get(ctx, "/n")
	wins := make(chan int, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := s.Put(ctx, "/n", fmt.Appendf(nil, "%d", i), kv.Revision); err == nil {
				wins <- i
			} else if !errors.Is(err, store.ErrConflict) {
				t.Errorf("writer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	close(wins)
	if n := len(wins); n != 1 {
		t.Fatalf("%d writers won one revision, want 1", n)
	}
}

// TestGroupCommitQueueBounded: writes beyond MaxQueued waiting at once are
// refused at once with ErrBusy, not queued without end.
func TestGroupCommitQueueBounded(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/groupq", MaxInFlight: 4, MaxQueued: 2, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Hold the queue: fill it by hand (no sender runs for these units).
	s.grp.mu.Lock()
	s.grp.queue = append(s.grp.queue, &unit{op: "put", keys: []string{"/a"}, enq: time.Now(), done: make(chan struct{})}, &unit{op: "put", keys: []string{"/b"}, enq: time.Now(), done: make(chan struct{})})
	s.grp.mu.Unlock()
	_, err = s.Put(context.Background(), "/c", []byte("v"), 0)
	if !errors.Is(err, store.ErrBusy) {
		t.Fatalf("write past a full queue: %v, want ErrBusy", err)
	}
	s.grp.mu.Lock()
	s.grp.queue = nil
	s.grp.mu.Unlock()
}

// TestGroupCommitAbandonedBufferReused: a writer whose context ends while its
// write still waits for a batch returns at once and reuses its buffer (as
// store/record's pooled encoder does); the write, if it still commits,
// carries the value as it was when Put was called, and -race sees no
// sender reading the caller's buffer.
func TestGroupCommitAbandonedBufferReused(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/abandon", MaxInFlight: 4, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			buf := fmt.Appendf(nil, "value-%03d", i)
			ctx, cancel := context.WithCancel(context.Background())
			go cancel()
			_, _ = s.Put(ctx, fmt.Sprintf("/k/%03d", i), buf, 0)
			copy(buf, "XXXXXXXXX") // the caller's buffer goes back to its pool
		})
	}
	wg.Wait()
	// What was queued still drains; wait for the queue to empty.
	deadline := time.Now().Add(time.Minute)
	for {
		s.grp.mu.Lock()
		left := len(s.grp.queue) + s.grp.senders
		s.grp.mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	written := 0
	for i := range n {
		kv, err := s.Get(context.Background(), fmt.Sprintf("/k/%03d", i))
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		written++
		if want := fmt.Sprintf("value-%03d", i); string(kv.Value) != want {
			t.Fatalf("key %d holds %q, want %q: the sender read a buffer its caller had reused", i, kv.Value, want)
		}
	}
	t.Logf("%d of %d abandoned writes committed, each with its value as given", written, n)
}
