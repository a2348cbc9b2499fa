package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// onConnect is the session hook: a machine's agent attached (ctx is its
// stream's context, the same onCSR gets). A pending wipe goes first,
// then a release's pending erase; an INSTALLING machine's plan is
// (re)sent, and its certificate request is then taken on this stream
// only.
func (l *Lifecycle) onConnect(ctx context.Context, machine string) {
	l.streams.attached(ctx, machine)
	m, err := l.inv.GetMachine(ctx, machine)
	if err != nil || m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return
	}
	if l.deployOnConnect(ctx, m) {
		return
	}
	if m.GetWipe().GetDisk() != "" {
		l.sendWipe(ctx, m)
		return
	}
	if pendingErase(m) {
		l.sendErase(ctx, m) // erase.go
		return
	}
	if pendingCommission(m) {
		l.sendCommission(ctx, m) // commission.go
		return
	}
	if m.GetState() == inventoryv1.Machine_INSTALLING && !m.GetInstall().GetDone() {
		l.sendPlan(ctx, m)
	}
}

// progressOutcome is what one progress message did to the machine.
type progressOutcome int

const (
	progressStale progressOutcome = iota // not the current install or wipe
	progressStep
	progressFailed
	progressDone
	progressWiped
	progressWipeFailed
)

// onProgress is the session hook for a progress message. It changes the
// machine in one mutation: a message of the current install moves its
// step (or fails it, or marks it done, sets boot intent hypervisor and
// arms the boot watchdog for the reboot or kexec that follows: kexec.go);
// a "kexec" step reports the agent's kexec (kexec.go); one of the pending
// reprovision wipe clears it; any other is ignored.
func (l *Lifecycle) onProgress(ctx context.Context, machine string, p *nodev1.Progress) {
	ctx = context.WithoutCancel(ctx)
	if strings.HasPrefix(p.GetInstallId(), inventory.CommissionIDPrefix) {
		l.onCommissionProgress(ctx, machine, p) // commission.go
		return
	}
	if strings.HasPrefix(p.GetInstallId(), inventory.EraseIDPrefix) {
		l.onEraseProgress(ctx, machine, p) // erase.go
		return
	}
	if p.GetStep() == kexecStep {
		l.onKexecProgress(ctx, machine, p)
		return
	}
	if l.deployProgress(ctx, machine, p) {
		return // deploy.go
	}
	kexec := l.kexecPossible(machine)
	id := p.GetInstallId()
	now := timestamppb.New(l.now())
	var out progressOutcome
	var stale bool
	var reason, disk, current string
	var state inventoryv1.Machine_MachineState
	um, err := l.updateMachineRetrying(ctx, machine, func(m *inventoryv1.Machine) error {
		out, stale, reason, disk = progressStale, false, "", ""
		current, state = m.GetInstall().GetInstallId(), m.GetState()
		if wp := m.GetWipe(); id != "" && wp.GetWipeId() == id {
			if !p.GetDone() && p.GetError() == "" {
				return errSkip
			}
			disk = wp.GetDisk()
			m.Wipe = nil
			out = progressWiped
			if p.GetError() != "" {
				out = progressWipeFailed
				if inventory.Transition(m, inventory.EventWipeFailed) == nil {
					m.StateReason = fmt.Sprintf("reprovision wipe of %s: %s", disk, p.GetError())
				}
			}
			return nil
		}
		if id == "" || m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetInstallId() != id {
			stale = true
			return errSkip
		}
		if m.GetInstall().GetDone() {
			return errSkip
		}
		in := m.Install
		if p.GetStep() != "" {
			in.Step = p.GetStep()
		}
		in.Detail = p.GetDetail()
		in.UpdatedAt = now
		out = progressStep
		switch {
		case p.GetError() != "":
			out = progressFailed
			reason = fmt.Sprintf("install step %s: %s", cmp.Or(in.GetStep(), "?"), p.GetError())
			in.Error = p.GetError()
			if err := inventory.Transition(m, inventory.EventInstallFailed); err != nil {
				return err
			}
			m.StateReason = reason
		case p.GetDone():
			out = progressDone
			in.Done = true
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR
			m.StateReason = "installed: rebooting into the hypervisor"
			// The reboot (or kexec) follows at once; disarmed again if
			// it cannot be made.
			m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: now, ArmedBy: armedByInstall}
			if kexec {
				m.StateReason = "installed: booting the hypervisor image with kexec"
				m.Watchdog.ArmedBy = ArmedByKexec
			}
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("install progress not recorded", "machine", machine, "err", err)
		} else if stale {
			l.log.Info("stale progress ignored", "machine", machine, "install_id", id, "current", current, "state", state.String())
		}
		return
	}
	switch out {
	case progressWipeFailed:
		l.event(um, "lifecycle", "wipe-failed", um.GetStateReason(), map[string]string{"install_id": id})
	case progressWiped:
		l.event(um, "lifecycle", "wiped", "disk "+disk+" wiped", map[string]string{"install_id": id})
		if um.GetState() == inventoryv1.Machine_INSTALLING && !um.GetInstall().GetDone() && l.sess.connected(um.GetName()) {
			l.sendPlan(ctx, um)
		}
	case progressFailed:
		l.event(um, "lifecycle", "install-failed", reason, map[string]string{"install_id": id})
		l.log.Warn("install failed", "machine", machine, "install_id", id, "reason", reason)
	case progressDone:
		l.event(um, "lifecycle", "installed", "install "+id+" done: boot intent hypervisor", map[string]string{"install_id": id})
		l.log.Info("install done: rebooting into the hypervisor", "machine", machine, "install_id", id, "kexec", kexec)
		l.installReboot(ctx, um, id)
	case progressStale, progressStep:
		// Nothing to announce: a stale report is dropped, a step only
		// recorded.
	}
}

// reboot restarts a machine whose boot watchdog is armed into network
// boot: with an enrolled BMC next boot PXE and a power cycle, otherwise
// the Reboot command on its session. When neither can be done the
// watchdog is disarmed and the operator is told to reboot it by hand.
func (l *Lifecycle) reboot(ctx context.Context, m *inventoryv1.Machine, why string) {
	if hasBMC(m) && l.cfg.BMC != nil {
		if err := l.pxeCycle(ctx, m, why); err == nil {
			return
		}
	}
	if err := l.sess.send(m.GetName(), &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Reboot_{Reboot: &nodev1.ApplianceMessage_Reboot{}}}); err != nil {
		l.event(m, "lifecycle", "reboot-failed", why+": no BMC and no agent session: reboot the machine by hand", nil)
		l.disarm(ctx, m.GetName(), m.GetWatchdog().GetArmedAt(), why+": no way to reboot")
		return
	}
	l.event(m, "lifecycle", "reboot", why+": reboot command sent to the agent", nil)
}

// pxeCycle sets next boot PXE and power-cycles through the BMC.
func (l *Lifecycle) pxeCycle(ctx context.Context, m *inventoryv1.Machine, why string) error {
	name := m.GetName()
	if err := l.cfg.BMC.SetBootDevice(ctx, name, inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE}); err != nil {
		l.event(m, "lifecycle", "power-cycle-failed", why+": next boot PXE: "+err.Error(), nil)
		return err
	}
	if _, err := l.cfg.BMC.SetPower(ctx, name, inventoryv1.PowerAction_POWER_ACTION_CYCLE); err != nil {
		l.event(m, "lifecycle", "power-cycle-failed", why+": "+err.Error(), nil)
		return err
	}
	l.event(m, "lifecycle", "power-cycle", why+": next boot PXE, power cycled through the BMC", nil)
	return nil
}
