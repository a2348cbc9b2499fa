package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Erase timeouts (docs/architecture.md, "Release and erase"): a full
// erase of big disks by zeroing is slow, so the whole erase gets hours;
// an erase that reports nothing for EraseStall is stuck (or its machine
// never booted discovery) and fails sooner.
const (
	DefaultEraseTimeout = 6 * time.Hour
	DefaultEraseStall   = 30 * time.Minute
)

// Outcomes of a finished erase (Config.EraseDone).
const (
	EraseOK      = "ok"
	EraseFailed  = "failed"
	EraseTimeout = "timeout"
)

// eraseTimeouts fills the defaults; the stall bound is never longer than
// the whole erase's.
func eraseTimeouts(total, stall time.Duration) (time.Duration, time.Duration) {
	if total <= 0 {
		total = DefaultEraseTimeout
	}
	if stall <= 0 {
		stall = DefaultEraseStall
	}
	return total, min(stall, total)
}

// pendingErase reports whether m is RELEASING with an erase not finished:
// its ErasePlan is (re)sent to its discovery agent.
func pendingErase(m *inventoryv1.Machine) bool {
	e := m.GetErase()
	return m.GetState() == inventoryv1.Machine_RELEASING && e.GetEraseId() != "" && e.GetFinishedAt() == nil
}

// eraseAttrs are the timeline attributes of m's erase.
func eraseAttrs(e *inventoryv1.Erase) map[string]string {
	return map[string]string{"install_id": e.GetEraseId(), "erase": inventory.EraseWords(e.GetLevel())}
}

// startErase starts a RELEASING machine's erase: the plan goes at once to
// an agent connected here; otherwise, with a BMC, the machine is
// power-cycled into network boot (next boot PXE; persistently when it had
// an OS deployed, whose deploy made its disk the persistent next boot)
// and gets the plan when its agent connects (onConnect); without one the
// timeline says to network-boot it. The erase timeout bounds the wait.
func (l *Lifecycle) startErase(ctx context.Context, m *inventoryv1.Machine, deployed bool) {
	if l.sess.connected(m.GetName()) {
		l.sendErase(ctx, m)
		return
	}
	if hasBMC(m) && l.cfg.BMC != nil {
		cycle := l.pxeCycle
		if deployed {
			// A one-time PXE boot would leave the deploy's persistent
			// disk boot behind it.
			cycle = l.discoveryCycle
		}
		if err := cycle(ctx, m, "erase"); err == nil {
			return
		}
	}
	l.event(m, "lifecycle", "erase-waiting", "waiting: network-boot the machine: the discovery agent erases its disks ("+
		strings.Join(m.GetErase().GetDisks(), ", ")+")", eraseAttrs(m.GetErase()))
}

// sendErase sends m's pending erase to its agent's session and records
// when.
func (l *Lifecycle) sendErase(ctx context.Context, m *inventoryv1.Machine) {
	name := m.GetName()
	e := m.GetErase()
	plan := &nodev1.ErasePlan{EraseId: e.GetEraseId(), Level: e.GetLevel(), Disks: e.GetDisks()}
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Erase{Erase: plan}}); err != nil {
		return
	}
	now := timestamppb.New(l.now())
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !pendingErase(m) || m.GetErase().GetEraseId() != e.GetEraseId() {
			return errSkip
		}
		m.Erase.SentAt = now
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("erase sent, not recorded", "machine", name, "erase_id", e.GetEraseId(), "err", err)
		}
		return
	}
	l.event(sm, "lifecycle", "erase-sent", fmt.Sprintf("erase %s (%s) of %s sent to the discovery agent", e.GetEraseId(),
		inventory.EraseWords(e.GetLevel()), strings.Join(e.GetDisks(), ", ")), eraseAttrs(e))
}

// eraseOutcome is what one progress message of an erase did.
type eraseOutcome int

const (
	eraseStep eraseOutcome = iota
	eraseDone
	eraseFailedNow
)

// onEraseProgress records a progress message of machine's current erase
// in one mutation: its step and detail; "erased" (done without an error)
// makes the machine READY (EventErased) and powers it off through its BMC
// (its standby pool powers it on when it needs it); an error makes it
// FAILED (EventEraseFailed) with the reason "erase: <error>", and it stays
// out of its pool until an operator erases it again. A message of any
// other erase, or of one finished, is dropped.
func (l *Lifecycle) onEraseProgress(ctx context.Context, machine string, p *nodev1.Progress) {
	id := p.GetInstallId()
	now := timestamppb.New(l.now())
	var out eraseOutcome
	var prevStep, prevDetail string
	um, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		if !pendingErase(m) || m.GetErase().GetEraseId() != id {
			return errSkip
		}
		e := m.Erase
		prevStep, prevDetail = e.GetStep(), e.GetDetail()
		if p.GetStep() != "" {
			e.Step = p.GetStep()
		}
		e.Detail = p.GetDetail()
		e.UpdatedAt = now
		out = eraseStep
		switch {
		case p.GetError() != "":
			if err := inventory.Transition(m, inventory.EventEraseFailed); err != nil {
				return err
			}
			out = eraseFailedNow
			e.Error = p.GetError()
			e.FinishedAt = now
			m.StateReason = "erase: " + p.GetError()
		case p.GetDone():
			if err := inventory.Transition(m, inventory.EventErased); err != nil {
				return err
			}
			out = eraseDone
			e.Step = "erased"
			e.FinishedAt = now
			m.StateReason = ""
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("erase progress not recorded", "machine", machine, "erase_id", id, "err", err)
		} else {
			l.log.Info("stale erase progress ignored", "machine", machine, "erase_id", id)
		}
		return
	}
	e := um.GetErase()
	level := inventory.EraseWords(e.GetLevel())
	switch out {
	case eraseStep:
		// One timeline entry per step and per disk, not per report: a full
		// erase reports every few seconds for hours.
		if e.GetStep() != prevStep || diskOf(e.GetDetail()) != diskOf(prevDetail) {
			l.event(um, "lifecycle", "erase-progress", cmp.Or(e.GetStep(), "erase")+": "+e.GetDetail(), eraseAttrs(e))
		}
	case eraseFailedNow:
		l.event(um, "lifecycle", "erase-failed", um.GetStateReason(), eraseAttrs(e))
		l.log.Warn("erase failed", "machine", machine, "erase_id", id, "erase", level, "err", e.GetError())
		l.eraseDone(e.GetLevel(), EraseFailed)
	case eraseDone:
		l.event(um, "lifecycle", "erased", fmt.Sprintf("erased: %s on %s: READY", level, strings.Join(e.GetDisks(), ", ")), eraseAttrs(e))
		l.log.Info("machine erased", "machine", machine, "erase_id", id, "erase", level)
		l.eraseDone(e.GetLevel(), EraseOK)
		if hasBMC(um) && l.cfg.BMC != nil {
			if _, err := l.cfg.BMC.SetPower(ctx, machine, inventoryv1.PowerAction_POWER_ACTION_OFF); err != nil {
				l.event(um, "lifecycle", "power-off-failed", "erased: power off through the BMC: "+err.Error(), nil)
			} else {
				l.event(um, "lifecycle", "power-off", "erased: powered off through the BMC until its pool needs it", nil)
			}
		}
	}
}

// diskOf is the disk an erase progress detail names ("/dev/sda: zeroing
// ..." → "/dev/sda").
func diskOf(detail string) string {
	d, _, _ := strings.Cut(detail, ":")
	return d
}

// eraseDone counts a finished erase (Config.EraseDone).
func (l *Lifecycle) eraseDone(level inventoryv1.EraseLevel, outcome string) {
	if l.cfg.EraseDone != nil {
		l.cfg.EraseDone(inventory.EraseWords(level), outcome)
	}
}

// eraseTimedOut fails a RELEASING machine's erase that has not finished
// within EraseTimeout of its request, or has reported nothing for
// EraseStall (counted from its request, its delivery or its last
// progress, whichever is latest). It reports whether it failed it.
func (l *Lifecycle) eraseTimedOut(ctx context.Context, m *inventoryv1.Machine) bool {
	if !pendingErase(m) || eraseOverdue(m.GetErase(), l.now(), l.cfg.EraseTimeout, l.cfg.EraseStall) == "" {
		return false
	}
	id := m.GetErase().GetEraseId()
	now := l.now()
	var reason string
	fm, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if !pendingErase(m) || m.GetErase().GetEraseId() != id {
			return errSkip
		}
		reason = eraseOverdue(m.GetErase(), now, l.cfg.EraseTimeout, l.cfg.EraseStall)
		if reason == "" {
			return errSkip
		}
		if err := inventory.Transition(m, inventory.EventEraseFailed); err != nil {
			return err
		}
		m.Erase.Error = reason
		m.Erase.FinishedAt = timestamppb.New(now)
		m.StateReason = "erase: " + reason
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("erase timeout not recorded", "machine", m.GetName(), "err", err)
		}
		return false
	}
	l.event(fm, "lifecycle", "erase-failed", fm.GetStateReason(), eraseAttrs(fm.GetErase()))
	l.log.Warn("erase timed out", "machine", m.GetName(), "erase_id", id, "reason", reason)
	l.eraseDone(fm.GetErase().GetLevel(), EraseTimeout)
	return true
}

// eraseOverdue says why erase e has run out of time at now, or "".
func eraseOverdue(e *inventoryv1.Erase, now time.Time, total, stall time.Duration) string {
	start := e.GetRequestedAt().AsTime()
	if now.Sub(start) > total {
		return fmt.Sprintf("timeout: not finished within %s (last step: %s)", total, lastStep(e))
	}
	last := start
	for _, t := range []*timestamppb.Timestamp{e.GetSentAt(), e.GetUpdatedAt()} {
		if t != nil && t.AsTime().After(last) {
			last = t.AsTime()
		}
	}
	if now.Sub(last) <= stall {
		return ""
	}
	switch {
	case e.GetSentAt() == nil:
		return fmt.Sprintf("timeout: no progress within %s: the plan was never delivered (no discovery agent connected: network-boot the machine)", stall)
	case e.GetStep() == "":
		return fmt.Sprintf("timeout: no progress within %s of the plan's delivery", stall)
	default:
		return fmt.Sprintf("timeout: no progress within %s after step %s", stall, lastStep(e))
	}
}

func lastStep(e *inventoryv1.Erase) string {
	switch {
	case e.GetStep() == "":
		return "none"
	case e.GetDetail() == "":
		return e.GetStep()
	}
	return e.GetStep() + " (" + e.GetDetail() + ")"
}

// deliverErase sends m's pending erase to its agent when the session is
// here and has not had it since it attached (the reconcilers' delivery).
func (l *Lifecycle) deliverErase(ctx context.Context, m *inventoryv1.Machine) {
	since, connected := l.sess.connectedSince(m.GetName())
	if !connected {
		return
	}
	if e := m.GetErase(); e.GetSentAt() == nil || e.GetSentAt().AsTime().Before(since) {
		l.sendErase(ctx, m)
	}
}
