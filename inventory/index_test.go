package inventory

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// TestIndexRecordMachineDisagrees: a serial index record is written before
// the machine record, so one may name a machine that never came to have
// that serial (its write failed, or corrald stopped between the two). A
// report carrying the serial does not land on that machine, and the
// record is taken over by the machine that does have it.
func TestIndexRecordMachineDisagrees(t *testing.T) {
	st := mem.New()
	inv := newInv(t, Config{Store: st})
	ctx := context.Background()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "other", BootMac: "52:54:00:00:0a:01"}); err != nil {
		t.Fatal(err)
	}
	key := serialPrefix + url.PathEscape("SN-IDX")
	if _, err := record.Put(ctx, st, key, &inventoryv1.MacBinding{MachineName: "other"}, 0); err != nil {
		t.Fatal(err)
	}
	m, err := inv.Register(ctx, "52:54:00:00:0a:02", facts("SN-IDX", "", "52:54:00:00:0a:02"), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetName() == "other" || m.GetSerial() != "SN-IDX" {
		t.Fatalf("report landed on %s (serial %q)", m.GetName(), m.GetSerial())
	}
	var b inventoryv1.MacBinding
	if _, err := record.Get(ctx, st, key, &b); err != nil || b.GetMachineName() != m.GetName() {
		t.Fatalf("index record names %q (%v), want %s", b.GetMachineName(), err, m.GetName())
	}
}

// TestIndexRecordsMoveWithTheMachine: creating a machine binds its MACs
// in the same transaction, a create that collides with another machine's
// MAC writes nothing, and deleting a machine deletes every index record
// that names it.
func TestIndexRecordsMoveWithTheMachine(t *testing.T) {
	st := mem.New()
	inv := newInv(t, Config{Store: st})
	ctx := context.Background()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r1", BootMac: "52:54:00:00:0b:01"}); err != nil {
		t.Fatal(err)
	}
	_, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r2", Macs: []string{"52:54:00:00:0b:02", "52:54:00:00:0b:01"}})
	if !errors.Is(err, apierr.ErrAlreadyExists) {
		t.Fatalf("create with a taken MAC = %v, want AlreadyExists", err)
	}
	if _, err := st.Get(ctx, macPrefix+"52:54:00:00:0b:02"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused create left a MAC binding: %v", err)
	}
	m, err := inv.Register(ctx, "52:54:00:00:0b:01", facts("SN-R1", "", "52:54:00:00:0b:01"), RegisterOptions{})
	if err != nil || m.GetName() != "r1" {
		t.Fatalf("register = %v, %v", m.GetName(), err)
	}
	if err := inv.DeleteMachine(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	kvs, err := st.List(ctx, "/inventory/")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if !strings.HasPrefix(kv.Key, timelinePrefix) && !strings.HasPrefix(kv.Key, store.TimelineIndexPrefix) {
			t.Errorf("after the delete %s is left", kv.Key)
		}
	}
}
