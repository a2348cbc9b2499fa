package lifecycle

import (
	"context"
	"errors"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// armWatchdog arms a machine's boot watchdog (cycles reset) when it is
// to network-boot (boot intent discover or hypervisor, not MAINTENANCE).
func (l *Lifecycle) armWatchdog(ctx context.Context, name, by string) {
	now := timestamppb.New(l.now())
	_, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() == inventoryv1.Machine_MAINTENANCE {
			return errSkip
		}
		switch m.GetBootIntent() {
		case inventoryv1.BootIntent_BOOT_INTENT_DISCOVER, inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR, inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED:
		default:
			return errSkip
		}
		m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: now, ArmedBy: by}
		return nil
	})
	if err != nil && !errors.Is(err, errSkip) {
		l.log.Warn("boot watchdog not armed", "machine", name, "err", err)
	}
}

// disarm disarms a machine's boot watchdog; with armedAt set, only one
// still armed at that time (not re-armed since).
func (l *Lifecycle) disarm(ctx context.Context, name string, armedAt *timestamppb.Timestamp, why string) {
	_, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		at := m.GetWatchdog().GetArmedAt()
		if at == nil || (armedAt != nil && !at.AsTime().Equal(armedAt.AsTime())) {
			return errSkip
		}
		m.Watchdog = nil
		return nil
	})
	switch {
	case err == nil:
		l.log.Debug("boot watchdog disarmed", "machine", name, "why", why)
	case !errors.Is(err, errSkip):
		l.log.Warn("boot watchdog not disarmed", "machine", name, "why", why, "err", err)
	}
}

// watchdogReasonPrefix starts the state reason of a machine the boot
// watchdog failed.
const watchdogReasonPrefix = "boot watchdog:"

// watchdog acts on an expired boot watchdog: with a BMC it power-cycles
// (PXE first) up to BootWatchdogCycles times, then (or at once without a
// BMC) the machine is FAILED with its last timeline entry as the reason.
// It reports whether it acted.
func (l *Lifecycle) watchdog(ctx context.Context, m *inventoryv1.Machine) bool {
	w := m.GetWatchdog()
	if w.GetArmedBy() == ArmedByKexec && w.GetArmedAt() != nil {
		// Its own bound and its own fallback (kexec.go).
		return l.kexecExpired(ctx, m)
	}
	if l.cfg.BootWatchdog < 0 || w.GetArmedAt() == nil || l.now().Sub(w.GetArmedAt().AsTime()) < l.cfg.BootWatchdog {
		return false
	}
	name := m.GetName()
	armed := w.GetArmedAt().AsTime()
	if int(w.GetCycles()) < l.cfg.BootWatchdogCycles && hasBMC(m) && l.cfg.BMC != nil {
		n := w.GetCycles() + 1
		// Claim this expiry first (CAS on the arm time), so two
		// reconcilers never cycle one machine twice for it.
		now := timestamppb.New(l.now())
		cm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
			if m.GetState() == inventoryv1.Machine_MAINTENANCE || !m.GetWatchdog().GetArmedAt().AsTime().Equal(armed) {
				return errSkip
			}
			m.Watchdog.ArmedAt = now
			m.Watchdog.Cycles = n
			return nil
		})
		if err != nil {
			return false
		}
		detail := fmt.Sprintf("boot watchdog: no agent after %s: power cycle %d/%d", l.cfg.BootWatchdog, n, l.cfg.BootWatchdogCycles)
		l.event(cm, "watchdog", "power-cycle", detail, map[string]string{"cycle": fmt.Sprint(n)})
		l.log.Warn("boot watchdog expired: power cycling", "machine", name, "cycle", n)
		_ = l.pxeCycle(ctx, cm, "boot watchdog")
		return true
	}
	last := l.lastEntry(ctx, name)
	var reason string
	if w.GetCycles() > 0 {
		reason = fmt.Sprintf(watchdogReasonPrefix+" no agent after %s ×%d; last: %s", l.cfg.BootWatchdog, w.GetCycles(), last)
	} else {
		reason = fmt.Sprintf(watchdogReasonPrefix+" no agent after %s (no BMC to power-cycle); last: %s", l.cfg.BootWatchdog, last)
	}
	fm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !m.GetWatchdog().GetArmedAt().AsTime().Equal(armed) || inventory.Transition(m, inventory.EventWatchdogExpired) != nil {
			return errSkip
		}
		m.Watchdog = nil
		m.StateReason = reason
		return nil
	})
	if err != nil {
		return false
	}
	l.event(fm, "watchdog", "failed", reason, nil)
	l.log.Warn("boot watchdog: machine FAILED", "machine", name, "reason", reason)
	return true
}

// lastEntry describes the newest timeline entry not written by the
// watchdog or its own power actions: the last thing the machine did.
func (l *Lifecycle) lastEntry(ctx context.Context, name string) string {
	es, err := l.ev.Timeline(ctx, name, "", 200)
	if err != nil {
		return "no timeline"
	}
	for k := len(es) - 1; k >= 0; k-- {
		e := es[k]
		switch e.GetSource() {
		case "watchdog", "bmc", "lifecycle":
			continue
		}
		s := e.GetSource() + " " + e.GetEvent()
		// Name what was fetched and how it ended (HTTP, TFTP entries).
		for _, k := range []string{"status", "path", "file"} {
			if v := e.GetAttributes()[k]; v != "" {
				s += " " + k + "=" + v
			}
		}
		if e.GetDetail() != "" {
			s += ": " + e.GetDetail()
		}
		return s
	}
	return "nothing in the timeline"
}
