package lifecycle

import (
	"context"
	"errors"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
)

// SetErasePolicy sets what a release erases by default: the standby
// pool's erase level (Config.ErasePolicy). Safe for concurrent use; the
// appliance calls it once its standby pools exist.
func (l *Lifecycle) SetErasePolicy(p inventory.ErasePolicy) {
	l.eraseMu.Lock()
	defer l.eraseMu.Unlock()
	l.cfg.ErasePolicy = p
}

func (l *Lifecycle) erasePolicy() inventory.ErasePolicy {
	l.eraseMu.Lock()
	defer l.eraseMu.Unlock()
	return l.cfg.ErasePolicy
}

// Release is MachineService's ReleaseMachine (inventory.Releaser): it ends
// machine name's allocation through inventory.ReleaseMachine, by by (its
// owner or an operator), with opts.Erase, whose default is the machine's
// standby pool's level (ErasePolicy). A machine released with an erase
// is RELEASING: its ErasePlan goes to its discovery agent at once when
// the agent is connected; otherwise a machine with a BMC is power-cycled
// into network boot and gets the plan when its agent connects, and one
// without is left for the operator to network-boot (its timeline says
// so). A machine released without an erase is READY at once; one that
// had an operating system deployed boots discovery from now on (boot
// intent discover; next boot PXE, persistently, through its BMC).
// Errors are inventory.ReleaseMachine's.
func (l *Lifecycle) Release(ctx context.Context, by inventory.Owner, name string, opts inventory.ReleaseOptions) (*inventoryv1.Machine, error) {
	r, ok := l.inv.(releaser)
	if !ok {
		return nil, apierr.Preconditionf("machine %q: this appliance's inventory does not release machines", name)
	}
	if opts.Pools == nil {
		if p := l.erasePolicy(); p != nil {
			opts.Pools = p
		}
	}
	m, err := r.ReleaseMachine(ctx, by, name, opts)
	if err != nil {
		return nil, err
	}
	l.afterRelease(ctx, m)
	if cur, err := l.inv.GetMachine(ctx, name); err == nil {
		return cur, nil
	}
	return m, nil
}

// afterRelease does what follows a release's mutation: the deployment's
// hook, then the erase or the boot back into discovery.
func (l *Lifecycle) afterRelease(ctx context.Context, m *inventoryv1.Machine) {
	ctx = context.WithoutCancel(ctx)
	deployed := m.GetDeployment() != nil
	l.onReleased(ctx, m)
	switch {
	case m.GetState() == inventoryv1.Machine_RELEASING:
		l.startErase(ctx, m, deployed)
	case deployed && hasBMC(m) && l.cfg.BMC != nil:
		_ = l.bootDiscovery(ctx, m, "release") // a failure is on the timeline
	}
}

// onReleased is the deploy's share of a release: m is the machine as
// released (its allocation ended), with the deployment it had, if any.
// The deployment is closed here (the record keeps a deployment only until
// the machine is released). The deploy's address pin goes here too, before
// the deployment is cleared (a failure is logged; the release stands).
func (l *Lifecycle) onReleased(ctx context.Context, m *inventoryv1.Machine) {
	d := m.GetDeployment()
	if d == nil {
		return
	}
	if err := l.UnpinDeployment(ctx, m); err != nil {
		l.log.Warn("released machine's address not unpinned", "machine", m.GetName(), "err", err)
	}
	id := d.GetDeploymentId()
	_, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if m.GetDeployment().GetDeploymentId() != id || m.GetState() == inventoryv1.Machine_DEPLOYING {
			return errSkip
		}
		m.Deployment = nil
		return nil
	})
	if err != nil && !errors.Is(err, errSkip) {
		l.log.Warn("released machine's deployment not cleared", "machine", m.GetName(), "deployment_id", id, "err", err)
	}
}

// bootDiscovery makes a machine that had an operating system deployed
// (next boot its disk, persistently) network-boot again: next boot PXE,
// persistently, through its BMC. Failures go to the timeline.
func (l *Lifecycle) bootDiscovery(ctx context.Context, m *inventoryv1.Machine, why string) error {
	req := inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE, Persistent: true}
	if err := l.cfg.BMC.SetBootDevice(ctx, m.GetName(), req); err != nil {
		l.event(m, "lifecycle", "boot-device-failed", why+": next boot PXE (persistent): "+err.Error(), nil)
		return err
	}
	l.event(m, "lifecycle", "boot-device", why+": next boot PXE, persistent: the machine boots discovery, not its disk", nil)
	return nil
}

// discoveryCycle is pxeCycle for a machine that had an operating system
// deployed: next boot PXE persistently (bootDiscovery), then a power
// cycle through the BMC.
func (l *Lifecycle) discoveryCycle(ctx context.Context, m *inventoryv1.Machine, why string) error {
	if err := l.bootDiscovery(ctx, m, why); err != nil {
		return err
	}
	if _, err := l.cfg.BMC.SetPower(ctx, m.GetName(), inventoryv1.PowerAction_POWER_ACTION_CYCLE); err != nil {
		l.event(m, "lifecycle", "power-cycle-failed", why+": "+err.Error(), nil)
		return err
	}
	l.event(m, "lifecycle", "power-cycle", why+": power cycled through the BMC into network boot", nil)
	return nil
}
