package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/corralhq/corral/store"
)

// RunSnapshot checks a store.Snapshotter: the snapshot holds exactly the
// records present at its revision (a record deleted before is absent, one
// written after is not in it), in key order, with their own revisions, and
// values the caller may modify. newStore must return an empty store that
// implements store.Snapshotter.
func RunSnapshot(t *testing.T, newStore func(t *testing.T) store.Store) {
	ctx := context.Background()
	s := newStore(t)
	sn, ok := s.(store.Snapshotter)
	if !ok {
		t.Fatalf("%T does not implement store.Snapshotter", s)
	}
	if rev, kvs, err := sn.Snapshot(ctx); err != nil || len(kvs) != 0 {
		t.Fatalf("empty store: rev %d, %d records, %v", rev, len(kvs), err)
	}
	for i := range 50 {
		if _, err := s.Put(ctx, fmt.Sprintf("/snap/k%02d", i), []byte(fmt.Sprint(i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := s.Get(ctx, "/snap/k07")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "/snap/k07", kv.Revision); err != nil {
		t.Fatal(err)
	}

	// Writers keep going during the snapshot; whatever they wrote is in
	// it exactly when its revision is at most the snapshot's.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Put(ctx, fmt.Sprintf("/snap/later%04d", i), []byte("x"), 0); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	rev, kvs, err := sn.Snapshot(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	all, err := s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var want []store.KV
	for _, kv := range all {
		if kv.Revision <= rev {
			want = append(want, kv)
		}
	}
	if len(kvs) != len(want) {
		t.Fatalf("snapshot at %d holds %d records, the store had %d at that revision", rev, len(kvs), len(want))
	}
	for i, kv := range kvs {
		w := want[i]
		if kv.Key != w.Key || string(kv.Value) != string(w.Value) || kv.Revision != w.Revision {
			t.Fatalf("record %d: %q@%d, want %q@%d", i, kv.Key, kv.Revision, w.Key, w.Revision)
		}
		if kv.Key == "/snap/k07" {
			t.Fatal("the deleted key is in the snapshot")
		}
	}
	// The values are copies.
	kvs[0].Value[0] ^= 0xff
	if again, _ := s.Get(ctx, kvs[0].Key); again.Value[0] == kvs[0].Value[0] {
		t.Error("modifying a snapshot value changed the store")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sn.Snapshot(ctx); err == nil {
		t.Error("Snapshot after Close succeeded")
	}
}
