package lifecycle

import (
	"context"
	"errors"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
)

// DeleteMachine deletes the machine (inventory's rules: refused while
// INSTALLING, DEPLOYED, RELEASING or allocated) and then revokes every certificate issued for
// its node. A machine already gone has its certificates revoked all the
// same, so a delete whose revocation failed can be retried. It is the
// MachineService DeleteMachine verb (inventory.LifecycleVerbs).
func (l *Lifecycle) DeleteMachine(ctx context.Context, name string) error {
	m, err := l.inv.GetMachine(ctx, name)
	switch {
	case errors.Is(err, apierr.ErrNotFound):
		m = &inventoryv1.Machine{Name: name}
	case err != nil:
		return err
	}
	derr := l.inv.DeleteMachine(ctx, name)
	if derr != nil && !errors.Is(derr, apierr.ErrNotFound) {
		return derr
	}
	if inventory.CheckName(name) == nil {
		if err := l.revokeCerts(ctx, m, "machine deleted"); err != nil {
			return err
		}
	}
	return derr
}

// SetPower performs a power action through the machine's BMC; on, cycle
// and reset arm the machine's boot watchdog when it is to network-boot.
// Without BMC control it is ErrPrecondition.
func (l *Lifecycle) SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error) {
	if l.cfg.BMC == nil {
		return nil, apierr.Preconditionf("BMC control is not configured on this appliance")
	}
	ps, err := l.cfg.BMC.SetPower(ctx, name, a)
	if err != nil {
		return nil, err
	}
	switch a {
	case inventoryv1.PowerAction_POWER_ACTION_ON, inventoryv1.PowerAction_POWER_ACTION_CYCLE, inventoryv1.PowerAction_POWER_ACTION_RESET:
		l.armWatchdog(ctx, name, "power "+strings.ToLower(strings.TrimPrefix(a.String(), "POWER_ACTION_")))
	default:
		// Off, soft off (and unspecified, refused by SetPower): the machine
		// will not boot, so no boot watchdog.
	}
	return ps, nil
}
