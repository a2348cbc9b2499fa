package record_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

func binding(name string) *inventoryv1.MacBinding { return &inventoryv1.MacBinding{MachineName: name} }

// TestRunTxMovesAClaimAtomically: many goroutines move one claim between
// two index keys at once; every committed transaction moves it whole, so
// exactly one key holds it at the end and the count of moves adds up.
func TestRunTxMovesAClaimAtomically(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	if _, err := record.Put(ctx, s, "a", binding("x"), 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_, err := record.RunTx(ctx, s, func(tx *record.Tx) error {
					var a, b inventoryv1.MacBinding
					hasA, err := tx.Get(ctx, "a", &a)
					if err != nil {
						return err
					}
					if _, err := tx.Get(ctx, "b", &b); err != nil {
						return err
					}
					from, to := "a", "b"
					if !hasA {
						from, to = "b", "a"
					}
					if err := tx.Delete(from); err != nil {
						return err
					}
					return tx.Put(to, binding("x"))
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	_, errA := s.Get(ctx, "a")
	_, errB := s.Get(ctx, "b")
	if (errA == nil) == (errB == nil) {
		t.Fatalf("after 400 moves: a err=%v, b err=%v; want exactly one key", errA, errB)
	}
	// 400 moves: an even number brings the claim back to a.
	if errA != nil {
		t.Errorf("the claim ended on b after an even number of moves")
	}
}

// TestTxChecksWhatItRead: a key read but not written is a precondition.
func TestTxChecksWhatItRead(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	rev, err := record.Put(ctx, s, "guard", binding("m1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err = record.RunTx(ctx, s, func(tx *record.Tx) error {
		calls++
		var g, w inventoryv1.MacBinding
		if _, err := tx.Get(ctx, "guard", &g); err != nil {
			return err
		}
		if calls == 1 {
			// Someone changes the guard between the read and the commit.
			if _, err := record.Put(ctx, s, "guard", binding("m2"), rev); err != nil {
				return err
			}
		}
		if _, err := tx.Get(ctx, "w", &w); err != nil {
			return err
		}
		return tx.Put("w", binding(g.GetMachineName()))
	})
	if err != nil {
		t.Fatal(err)
	}
	var w inventoryv1.MacBinding
	if _, err := record.Get(ctx, s, "w", &w); err != nil || w.GetMachineName() != "m2" || calls != 2 {
		t.Fatalf("w = %q (%v) after %d calls; want m2 written by the second attempt", w.GetMachineName(), err, calls)
	}
}

func TestTxRefusesAWriteWithoutARead(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	_, err := record.RunTx(ctx, s, func(tx *record.Tx) error { return tx.Put("k", binding("m")) })
	if err == nil {
		t.Fatal("a write of a key the transaction never read was accepted")
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("k was written: %v", err)
	}
}
