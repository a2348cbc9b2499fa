package lifecycle

import (
	"context"
	"errors"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// failingRevoker cannot reach the revocation list.
type failingRevoker struct{}

func (failingRevoker) RevokeNode(context.Context, string, string) error {
	return errors.New("store unavailable")
}

// TestRevokeOnReprovisionAndDelete: reprovision and delete revoke the
// certificates of the machine's node (its name and a different node name);
// a revocation that fails stops reprovision before anything changes, and a
// delete of a machine already gone still revokes.
func TestRevokeOnReprovisionAndDelete(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	for _, m := range []*inventoryv1.Machine{
		{Name: "r1", State: inventoryv1.Machine_DEPLOYED, NodeName: "r1"},
		{Name: "r2", State: inventoryv1.Machine_INVENTORIED, NodeName: "old-node"},
		{Name: "r3", State: inventoryv1.Machine_DEPLOYED},
	} {
		if _, err := h.inv.CreateMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.msrv.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: "r1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.msrv.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "r2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.msrv.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "r2"}); status.Code(err) != codes.NotFound {
		t.Fatalf("second delete = %v, want NotFound", err)
	}
	// A refused delete (DEPLOYED) revokes nothing.
	if _, err := h.msrv.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "r3"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete DEPLOYED = %v, want FailedPrecondition", err)
	}
	want := []string{"r1", "r2", "old-node", "r2"}
	if d := cmp.Diff(want, h.certs.revoked()); d != "" {
		t.Errorf("revoked (-want +got):\n%s", d)
	}

	h.lc.cfg.Certs = failingRevoker{}
	before, _ := h.inv.GetMachine(ctx, "r3")
	if _, err := h.msrv.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: "r3"}); err == nil {
		t.Fatal("reprovision succeeded without revoking")
	}
	after, _ := h.inv.GetMachine(ctx, "r3")
	if after.GetState() != before.GetState() || after.GetBootIntent() != before.GetBootIntent() {
		t.Errorf("a failed revocation changed the machine: %v -> %v", before.GetState(), after.GetState())
	}
}
