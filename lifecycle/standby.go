package lifecycle

import (
	"context"
	"errors"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The standby controller's power paths (lifecycle/standby,
// docs/architecture.md "Standby pools"). Each claims the machine by
// compare-and-swap first, re-checking that it is READY and free, so a
// machine allocated since the controller looked is never touched.

// ErrNotStandby means the machine is no longer a free READY machine (or
// already booting): the standby controller leaves it alone. Class
// apierr.ErrPrecondition.
var ErrNotStandby = fmt.Errorf("%w: not a free READY machine", apierr.ErrPrecondition)

// standbyFree reports whether m is a READY machine no one holds.
func standbyFree(m *inventoryv1.Machine) bool {
	a := m.GetAllocation()
	return m.GetState() == inventoryv1.Machine_READY && (a == nil || a.GetReleasedAt() != nil)
}

// AgentConnected reports whether machine's discovery agent holds a session
// on this appliance.
func (l *Lifecycle) AgentConnected(machine string) bool { return l.sess.connected(machine) }

// StandbyPowerOn boots a free READY machine into discovery for a standby
// pool: one compare-and-swap arms its boot watchdog (armed_by by) and sets
// boot intent DISCOVER, only while it is READY, free and not already
// booting; then its BMC sets the next boot to PXE and powers it on. A
// machine whose agent does not register within the boot watchdog is
// cycled and FAILED like any other power-on. A BMC error disarms the
// watchdog again and is returned; ErrNotStandby when the claim failed.
func (l *Lifecycle) StandbyPowerOn(ctx context.Context, name, by string) error {
	if l.cfg.BMC == nil {
		return apierr.Preconditionf("BMC control is not configured on this appliance")
	}
	now := timestamppb.New(l.now())
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !standbyFree(m) || m.GetWatchdog().GetArmedAt() != nil {
			return ErrNotStandby
		}
		if !hasBMC(m) {
			return apierr.Preconditionf("machine %s has no BMC enrolled", name)
		}
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		if l.cfg.BootWatchdog >= 0 {
			m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: now, ArmedBy: by}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fail := func(step string, err error) error {
		l.disarm(context.WithoutCancel(ctx), name, now, by+": "+step+" failed")
		l.event(m, "lifecycle", "standby-power-on-failed", by+": "+step+": "+err.Error(), nil)
		return fmt.Errorf("%s: %s: %w", name, step, err)
	}
	if err := l.cfg.BMC.SetBootDevice(ctx, name, inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE}); err != nil {
		return fail("next boot PXE", err)
	}
	if _, err := l.cfg.BMC.SetPower(ctx, name, inventoryv1.PowerAction_POWER_ACTION_ON); err != nil {
		return fail("power on", err)
	}
	l.event(m, "lifecycle", "standby-power-on", by+": next boot PXE, powered on into discovery", nil)
	return nil
}

// StandbyPowerOff powers a free READY machine off for a standby pool: one
// compare-and-swap re-checks that it is READY and free and disarms its
// boot watchdog (a machine powered off is not expected to boot); then its
// BMC powers it off. ErrNotStandby when the machine is no longer free.
func (l *Lifecycle) StandbyPowerOff(ctx context.Context, name, by string) error {
	if l.cfg.BMC == nil {
		return apierr.Preconditionf("BMC control is not configured on this appliance")
	}
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !standbyFree(m) {
			return ErrNotStandby
		}
		if !hasBMC(m) {
			return apierr.Preconditionf("machine %s has no BMC enrolled", name)
		}
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := l.cfg.BMC.SetPower(ctx, name, inventoryv1.PowerAction_POWER_ACTION_OFF); err != nil {
		l.event(m, "lifecycle", "standby-power-off-failed", by+": "+err.Error(), nil)
		return fmt.Errorf("%s: power off: %w", name, err)
	}
	l.event(m, "lifecycle", "standby-power-off", by+": powered off", nil)
	return nil
}

// IsNotStandby reports whether err says the machine was no longer free.
func IsNotStandby(err error) bool { return errors.Is(err, ErrNotStandby) }
