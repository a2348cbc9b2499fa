package dhcp

import (
	"context"
	"fmt"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// failingInventory answers every EnsureMachineForMAC with err.
type failingInventory struct{ err error }

func (f failingInventory) EnsureMachineForMAC(context.Context, string) (*inventoryv1.Machine, bool, error) {
	return nil, false, f.err
}

// TestDiscoverSilentWhileStoreBusy: a network-booting client whose
// machine cannot be recorded because the store is saturated or does not
// answer gets no OFFER (it retransmits, and is recorded then) instead of
// an address and a boot file that lead to a script that does not know it;
// the discovered-machines cap still answers without a boot file, and a
// client that does not network-boot is answered as before.
func TestDiscoverSilentWhileStoreBusy(t *testing.T) {
	for name, err := range map[string]error{
		"saturated": fmt.Errorf("store/etcd: get /inventory/macs/x: %w", store.ErrBusy),
		"no answer": apierr.Unavailablef("store/etcd: get /inventory/macs/x: the etcd cluster did not answer within 5s"),
		"deadline":  fmt.Errorf("inventory: %w", context.DeadlineExceeded),
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, ModeFull, func(c *Config) { c.Inventory = failingInventory{err} })
			if o, _ := f.do(t, discover(t, mac(0x950), biosPXE)); o != nil {
				t.Fatalf("answered %s while the store is busy, want silence", msgType(o))
			}
			if f.s.BusySilent() != 1 {
				t.Errorf("BusySilent %d, want 1", f.s.BusySilent())
			}
			if o, _ := f.do(t, discover(t, mac(0x951), plain)); msgType(o) != "OFFER" {
				t.Errorf("a client that does not network-boot got %v, want an OFFER", o)
			}
		})
	}
	f := newFixture(t, ModeFull, func(c *Config) {
		c.Inventory = failingInventory{apierr.Exhaustedf("inventory: too many discovered machines")}
	})
	if o, _ := f.do(t, discover(t, mac(0x952), biosPXE)); msgType(o) != "OFFER" {
		t.Fatalf("over the discovered cap: %v, want an OFFER without a boot file", o)
	}
}
