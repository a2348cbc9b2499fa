package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestAllocationExpires: the leader's reconcile releases a machine whose
// allocation expired, back to READY, and its owner reads why; an
// allocation without an expiry, or not yet expired, is left alone.
func TestAllocationExpires(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	for _, name := range []string{"e1", "e2"} {
		if _, err := h.inv.CreateMachine(ctx, &inventoryv1.Machine{Name: name, BootMac: "52:54:00:00:0e:0" + name[1:], State: inventoryv1.Machine_INVENTORIED,
			Facts: &inventoryv1.Facts{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); err != nil {
			t.Fatal(err)
		}
	}
	alice := inventory.Owner{ID: "token:alice", Name: "alice"}
	srv := &inventory.MachineServer{Inv: h.inv, Lifecycle: h.lc, Caller: func(context.Context) inventory.Owner { return alice }}
	exp, err := srv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Selector: "name=e1", ExpiresIn: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Selector: "name=e2"}); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(59 * time.Minute)
	if err := h.lc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ := h.inv.GetMachine(ctx, "e1"); m.GetState() != inventoryv1.Machine_ALLOCATED {
		t.Fatalf("e1 before its expiry: %s", m.GetState())
	}
	h.clk.Advance(time.Minute)
	if err := h.lc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := srv.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: "e1"})
	if err != nil {
		t.Fatal(err)
	}
	a := m.GetAllocation()
	want := "allocation expired at " + exp.GetMachines()[0].GetAllocation().GetExpiresAt().AsTime().UTC().Format(time.RFC3339)
	if m.GetState() != inventoryv1.Machine_READY || a.GetReleaseReason() != want || a.GetReleasedBy() != ExpiryOwner || a.GetOwner() != "token:alice" {
		t.Fatalf("e1 after its expiry: %s, allocation %v", m.GetState(), a)
	}
	if _, err := srv.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: "e1"}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the owner releases an expired machine: %v", err)
	}
	if m, _ := h.inv.GetMachine(ctx, "e2"); m.GetState() != inventoryv1.Machine_ALLOCATED {
		t.Fatalf("e2 without expiry: %s", m.GetState())
	}
	if err := h.inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	es, err := h.inv.Timeline(ctx, "e1", "", 20)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range es {
		events = append(events, e.GetEvent())
	}
	if got := strings.Join(events, ","); !strings.Contains(got, "pooled,allocated,expired") {
		t.Fatalf("timeline %s", got)
	}
}
