package lifecycle

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
)

// ExpiryOwner is who the expiry sweep releases machines as.
const ExpiryOwner = "corral:expiry"

// releaser ends allocations; implemented by *inventory.Inventory. A
// Machines without it has no expiry sweep.
type releaser interface {
	ReleaseMachine(ctx context.Context, by inventory.Owner, name string, opts inventory.ReleaseOptions) (*inventoryv1.Machine, error)
}

// expired reports whether m's allocation is open and has run out: an
// ALLOCATED machine, or one its owner deployed (DEPLOYING, DEPLOYED, or
// FAILED with the allocation open).
func (l *Lifecycle) expired(m *inventoryv1.Machine) bool {
	a := m.GetAllocation()
	e := a.GetExpiresAt()
	return a.GetOwner() != "" && e != nil && a.GetReleasedAt() == nil && !l.now().Before(e.AsTime())
}

// expire releases a machine whose allocation expired (zos: an expired
// reservation is decommissioned), as the leader's reconciler finds it. The
// release names that allocation only, so one made since is left alone, and
// records why, which the owner reads on the machine (allocation
// release_reason) and its timeline. It goes through Release, so the
// machine's standby pool's erase level applies: RELEASING until the erase
// succeeded when the pool erases, READY at once otherwise.
func (l *Lifecycle) expire(ctx context.Context, m *inventoryv1.Machine) {
	if _, ok := l.inv.(releaser); !ok {
		return
	}
	by := inventory.Owner{ID: ExpiryOwner, Operator: true}
	rm, err := l.Release(ctx, by, m.GetName(), inventory.ReleaseOptions{AllocationID: m.GetAllocation().GetAllocationId(), Expired: true})
	switch {
	case err == nil:
		l.log.Info("allocation expired: machine released", "machine", m.GetName(), "owner", m.GetAllocation().GetOwner(),
			"state", rm.GetState().String())
	case inventory.IsSkip(err):
	default:
		l.log.Warn("expired allocation not released", "machine", m.GetName(), "err", err)
	}
}
