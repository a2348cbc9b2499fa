package inventory

import (
	"context"
	"errors"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/protobuf/proto"
)

// caller is who calls (MachineServer.Caller), the operator Anonymous
// when nothing says.
func (s *MachineServer) caller(ctx context.Context) Owner {
	if s.Caller == nil {
		return Owner{ID: Anonymous, Operator: true}
	}
	return s.Caller(ctx)
}

// ownerFilter resolves a list's owner "me" to the caller.
func ownerFilter(req *inventoryv1.ListMachinesRequest, who Owner) *inventoryv1.ListMachinesRequest {
	if req.GetOwner() != "me" {
		return req
	}
	req = proto.CloneOf(req)
	req.Owner = who.ID
	return req
}

// visible drops, for a caller that is not an operator, the machines other
// callers hold. A page may then be shorter than asked; its token still
// leads on.
func visible(who Owner, ms []*inventoryv1.Machine) []*inventoryv1.Machine {
	if who.Operator {
		return ms
	}
	out := ms[:0]
	for _, m := range ms {
		if who.Sees(m) {
			out = append(out, m)
		}
	}
	return out
}

// hidden is what a caller hears of a machine another caller holds: the
// same as of a machine that does not exist.
func hidden(name string) error { return apierr.NotFoundf("machine %q", name) }

// checkSees fails with NotFound when the machine named (or owning mac) is
// held by someone other than the caller, who is not an operator.
func (s *MachineServer) checkSees(ctx context.Context, name, mac string) error {
	who := s.caller(ctx)
	if who.Operator {
		return nil
	}
	var m *inventoryv1.Machine
	var err error
	switch {
	case name != "":
		m, err = s.Inv.GetMachine(ctx, name)
	case mac != "":
		m, err = s.Inv.MachineByMAC(ctx, mac)
	default:
		return nil
	}
	if errors.Is(err, apierr.ErrNotFound) {
		return nil // the call itself answers for an unknown machine
	}
	if err != nil {
		return err
	}
	if !who.Sees(m) {
		return hidden(m.GetName())
	}
	return nil
}

// LabelMachine sets and removes a machine's labels, zone and pool
// (Inventory.LabelMachine).
func (s *MachineServer) LabelMachine(ctx context.Context, req *inventoryv1.LabelMachineRequest) (*inventoryv1.Machine, error) {
	return machineOrStatus(s.Inv.LabelMachine(ctx, req.GetName(), LabelChange{Set: req.GetSet(), Remove: req.GetRemove()}))
}

// AllocateMachines claims READY machines for the caller
// (Inventory.AllocateMachines).
func (s *MachineServer) AllocateMachines(ctx context.Context, req *inventoryv1.AllocateMachinesRequest) (*inventoryv1.AllocateMachinesResponse, error) {
	r := AllocateRequest{Selector: req.GetSelector(), Pool: req.GetPool(), Count: int(req.GetCount())}
	if d := req.GetExpiresIn(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, apierr.ToStatus(apierr.Invalidf("expires_in: %v", err))
		}
		r.ExpiresIn = d.AsDuration()
	}
	if req.GetCount() > MaxAllocationCount {
		r.Count = MaxAllocationCount + 1 // refused with the limit's words
	}
	ms, err := s.Inv.AllocateMachines(ctx, s.caller(ctx), r)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.AllocateMachinesResponse{Machines: ms}, nil
}

// Releaser is implemented by a LifecycleVerbs that releases machines
// itself (*lifecycle.Lifecycle): it resolves the pool's erase level and
// starts the erase a release asks for. Without it, ReleaseMachine is
// Inventory.ReleaseMachine alone, and no pool erases by default.
type Releaser interface {
	Release(ctx context.Context, by Owner, name string, opts ReleaseOptions) (*inventoryv1.Machine, error)
}

// ReleaseMachine ends a machine's allocation: its owner or an operator
// (Inventory.ReleaseMachine), erasing its disks at the level asked (an
// unknown level is InvalidArgument), through the lifecycle when it is a
// Releaser.
func (s *MachineServer) ReleaseMachine(ctx context.Context, req *inventoryv1.ReleaseMachineRequest) (*inventoryv1.Machine, error) {
	if len(req.GetReason()) > 256 {
		return nil, apierr.ToStatus(apierr.Invalidf("release reason: longer than 256 bytes"))
	}
	if err := CheckEraseLevel(req.GetErase()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	opts := ReleaseOptions{Reason: req.GetReason(), Erase: req.GetErase()}
	if r, ok := s.Lifecycle.(Releaser); ok {
		return machineOrStatus(r.Release(ctx, s.caller(ctx), req.GetName(), opts))
	}
	return machineOrStatus(s.Inv.ReleaseMachine(ctx, s.caller(ctx), req.GetName(), opts))
}
