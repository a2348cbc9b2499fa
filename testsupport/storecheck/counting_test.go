package storecheck

import (
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// TestCountingTxn: a transaction counts a write of each key it puts or
// deletes and a read of each key it checks, and commits underneath.
func TestCountingTxn(t *testing.T) {
	c := &Counting{Store: mem.New()}
	defer c.Close()
	rev, err := c.Put(t.Context(), "a/1", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ops := c.Measure(func() {
		if _, err := c.Txn(t.Context(), []store.Op{
			{Kind: store.OpPut, Key: "a/2", Value: []byte("2")},
			{Kind: store.OpDelete, Key: "a/1", Rev: rev},
			{Kind: store.OpCheck, Key: "b/1"},
		}); err != nil {
			t.Fatal(err)
		}
	})
	if w, r := ops.Writes("a/"), ops.Reads("b/"); w != 2 || r != 1 || len(ops) != 3 {
		t.Fatalf("counted %d writes under a/ and %d reads under b/ of %d operations, want 2, 1 of 3", w, r, len(ops))
	}
	if kv, err := c.Store.Get(t.Context(), "a/2"); err != nil || string(kv.Value) != "2" {
		t.Fatalf("a/2 = %+v, %v", kv, err)
	}
}
