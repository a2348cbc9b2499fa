package dhcp

import (
	"context"
	"fmt"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/mem"
)

// TestIntentMatchesInventory: the intent the timeline labels a packet
// with, taken from the record EnsureMachineForMAC returned, is the one
// inventory.BootIntent gives, for every state and intent.
func TestIntentMatchesInventory(t *testing.T) {
	ctx := context.Background()
	inv, err := inventory.New(inventory.Config{Store: mem.New()})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for st := range inventoryv1.Machine_MachineState_name {
		for in := range inventoryv1.BootIntent_name {
			n++
			hw := fmt.Sprintf("52:54:00:99:%02x:%02x", n>>8, n&0xff)
			m, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: fmt.Sprintf("m%d", n), BootMac: hw,
				State: inventoryv1.Machine_MachineState(st), BootIntent: inventoryv1.BootIntent(in)})
			if err != nil {
				t.Fatal(err)
			}
			_, want, err := inv.BootIntent(ctx, hw)
			if err != nil {
				t.Fatal(err)
			}
			if got := bootIntent(m); got != want {
				t.Errorf("state %v, intent %v: labelled %v, inventory says %v", m.GetState(), m.GetBootIntent(), got, want)
			}
		}
	}
	for in := range inventoryv1.BootIntent_name {
		i := inventoryv1.BootIntent(in)
		if got := "BOOT_INTENT_" + strings.ToUpper(intentLabel(i)); got != i.String() {
			t.Errorf("intent %v labelled %q", i, intentLabel(i))
		}
	}
}
