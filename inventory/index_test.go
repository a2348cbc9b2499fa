package inventory

import (
	"context"
	"net/url"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
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

// TestReleaseMACs: claims made for a change that failed go back, except
// those the machine's record lists.
func TestReleaseMACs(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r1", BootMac: "52:54:00:00:0b:01"}); err != nil {
		t.Fatal(err)
	}
	if err := inv.claimMAC(ctx, "52:54:00:00:0b:02", "r1"); err != nil {
		t.Fatal(err)
	}
	inv.releaseMACs(ctx, "r1", []string{"52:54:00:00:0b:01", "52:54:00:00:0b:02"})
	if m, err := inv.MachineByMAC(ctx, "52:54:00:00:0b:01"); err != nil || m.GetName() != "r1" {
		t.Fatalf("listed MAC released: %v %v", m, err)
	}
	if _, err := inv.MachineByMAC(ctx, "52:54:00:00:0b:02"); err == nil {
		t.Fatal("claim of a failed change kept")
	}
}
