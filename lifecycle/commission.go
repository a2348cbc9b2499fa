package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Commissioning (docs/architecture.md, "Commissioning"). Commission
// makes a machine's commissioning pending; its CommissionPlan goes to the
// discovery agent at once when its session is here, else the machine is
// power-cycled into network boot through its BMC and gets the plan when
// its agent connects (onConnect). The plan names the commissioning
// overlay (CommissionOverlay): an agent booted without it fetches and
// unpacks it. Each test result the agent reports is bounded and checked
// (inventory.CleanCommissionTest) and stored; the last message finishes
// the commissioning: passed when no stored test failed, failed otherwise
// (the agent's own verdict is not trusted to pass a machine), which holds
// the machine back from accept and allocation until an operator clears
// it.

// CommissionOverlay says where the commissioning overlay is served (an
// http URL on host, where the machine's agent reached this appliance, ""
// when unknown, for the machine of boot MAC mac), its SHA-256 and size
// from the catalog. Appliance wires
// boot/http's catalog to it.
type CommissionOverlay interface {
	CommissionOverlay(ctx context.Context, host, mac string) (url, sha256 string, size int64, err error)
}

// SetCommissionOverlay sets where plans find the overlay (nil: plans name
// none, and only machines booted with it can run the tests). Safe for
// concurrent use.
func (l *Lifecycle) SetCommissionOverlay(o CommissionOverlay) {
	l.kexecMu.Lock()
	defer l.kexecMu.Unlock()
	l.commissionOverlay = o
}

func (l *Lifecycle) overlay() CommissionOverlay {
	l.kexecMu.Lock()
	defer l.kexecMu.Unlock()
	return l.commissionOverlay
}

// pendingCommission reports whether m's commissioning waits for, or is
// with, its agent.
func pendingCommission(m *inventoryv1.Machine) bool {
	s := m.GetCommission().GetStatus()
	return s == inventory.CommissionPending || s == inventory.CommissionRunning
}

func commissionAttrs(c *inventoryv1.Commission) map[string]string {
	return map[string]string{"install_id": c.GetCommissionId(), "profile": c.GetProfile()}
}

// Commission starts commissioning machine name with profile, requested by
// by (inventory.StartCommission says which machines and profiles).
func (l *Lifecycle) Commission(ctx context.Context, name, profile, by string) (*inventoryv1.Machine, error) {
	now := l.now()
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		return inventory.StartCommission(m, profile, by, now)
	})
	if err != nil {
		return nil, err
	}
	c := m.GetCommission()
	l.event(m, "lifecycle", "commission-requested", fmt.Sprintf("commissioning %s (profile %s) requested by %s", c.GetCommissionId(), c.GetProfile(), by), commissionAttrs(c))
	switch {
	case l.sess.connected(name):
		l.sendCommission(ctx, m)
	case hasBMC(m) && l.cfg.BMC != nil:
		_ = l.discoveryCycle(ctx, m, "commission")
	default:
		l.event(m, "lifecycle", "commission-waiting", "waiting: network-boot the machine: its discovery agent runs the tests", commissionAttrs(c))
	}
	return l.inv.GetMachine(ctx, name)
}

// sendCommission sends m's pending commissioning to its agent and marks
// it running.
func (l *Lifecycle) sendCommission(ctx context.Context, m *inventoryv1.Machine) {
	name := m.GetName()
	c := m.GetCommission()
	plan := &nodev1.CommissionPlan{CommissionId: c.GetCommissionId(), Profile: c.GetProfile(), Steps: c.GetSteps()}
	if o := l.overlay(); o != nil {
		host, _, err := net.SplitHostPort(l.sess.endpoint(name))
		if err != nil {
			host = ""
		}
		if url, sum, size, err := o.CommissionOverlay(ctx, host, m.GetBootMac()); err == nil {
			plan.OverlayUrl, plan.OverlaySha256, plan.OverlaySize = url, sum, size
		} else {
			l.event(m, "lifecycle", "commission-overlay-missing", "commissioning overlay: "+err.Error()+" (the tests need its tools)", commissionAttrs(c))
		}
	}
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Commission{Commission: plan}}); err != nil {
		return
	}
	now := timestamppb.New(l.now())
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !pendingCommission(m) || m.GetCommission().GetCommissionId() != c.GetCommissionId() {
			return errSkip
		}
		m.Commission.SentAt = now
		m.Commission.Status = inventory.CommissionRunning
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("commissioning sent, not recorded", "machine", name, "commission_id", c.GetCommissionId(), "err", err)
		}
		return
	}
	l.event(sm, "lifecycle", "commission-sent", fmt.Sprintf("commissioning %s (profile %s, %d steps) sent to the discovery agent", c.GetCommissionId(), c.GetProfile(), len(c.GetSteps())), commissionAttrs(c))
}

// deliverCommission sends m's pending commissioning when its agent's
// session is here and has not had it since it attached.
func (l *Lifecycle) deliverCommission(ctx context.Context, m *inventoryv1.Machine) bool {
	if !pendingCommission(m) {
		return false
	}
	since, connected := l.sess.connectedSince(m.GetName())
	if !connected {
		return false
	}
	if c := m.GetCommission(); c.GetSentAt() == nil || c.GetSentAt().AsTime().Before(since) {
		l.sendCommission(ctx, m)
	}
	return true
}

// onCommissionProgress records one message of machine's current
// commissioning: a test result is checked, bounded and stored; the last
// message finishes it, failed when any stored test failed or the agent
// reported an error. A message of another commissioning is dropped.
func (l *Lifecycle) onCommissionProgress(ctx context.Context, machine string, p *nodev1.Progress) {
	id := p.GetInstallId()
	now := timestamppb.New(l.now())
	var stored *inventoryv1.CommissionTest
	var finished bool
	um, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		c := m.GetCommission()
		if !pendingCommission(m) || c.GetCommissionId() != id {
			return errSkip
		}
		stored, finished = nil, false
		c.Status = inventory.CommissionRunning
		if t := p.GetCommissionTest(); t != nil {
			if stored = inventory.CleanCommissionTest(c, t); stored != nil {
				c.Tests = append(c.Tests, stored)
				c.UpdatedAt = now
			}
		}
		if !p.GetDone() {
			if stored == nil {
				return errSkip
			}
			return nil
		}
		finished = true
		c.FinishedAt = now
		var failed []string
		for _, t := range c.GetTests() {
			if t.GetResult() == "fail" {
				failed = append(failed, strings.TrimSpace(t.GetName()+" "+t.GetTarget()))
			}
		}
		switch {
		case p.GetError() != "" && len(failed) == 0:
			c.Status, c.Error = inventory.CommissionFailed, "agent: "+cutDetail(p.GetError())
		case len(failed) > 0:
			c.Status, c.Error = inventory.CommissionFailed, fmt.Sprintf("%d of %d tests failed: %s", len(failed), len(c.GetTests()), strings.Join(failed, ", "))
		case len(c.GetTests()) == 0:
			c.Status, c.Error = inventory.CommissionFailed, "the agent reported no test"
		default:
			c.Status, c.Error = inventory.CommissionPassed, ""
		}
		m.UpdatedAt = now
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("commissioning progress not recorded", "machine", machine, "commission_id", id, "err", err)
		}
		return
	}
	c := um.GetCommission()
	if stored != nil {
		l.event(um, "lifecycle", "commission-test", termsafe.Escape(fmt.Sprintf("%s %s: %s: %s", stored.GetName(), stored.GetTarget(), stored.GetResult(), stored.GetSummary())), commissionAttrs(c))
	}
	if !finished {
		return
	}
	if c.GetStatus() == inventory.CommissionPassed {
		l.event(um, "lifecycle", "commissioned", fmt.Sprintf("commissioning passed: %d tests (profile %s)", len(c.GetTests()), c.GetProfile()), commissionAttrs(c))
		l.log.Info("machine commissioned", "machine", machine, "commission_id", id, "tests", len(c.GetTests()))
		return
	}
	l.event(um, "lifecycle", "commission-failed", termsafe.Escape("commissioning failed: "+c.GetError()+": held back from accept and allocation until cleared"), commissionAttrs(c))
	l.log.Warn("commissioning failed", "machine", machine, "commission_id", id, "err", termsafe.Escape(c.GetError()))
}

// cutDetail bounds an agent's error text.
func cutDetail(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > 512 {
		s = strings.ToValidUTF8(s[:512], "")
	}
	return s
}

// DefaultCommissionStall is how long a commissioning may go without a
// sign of life before it is failed: longer than any one test of the full
// profile (its memtester pass over 1 GiB twice, its 10-minute stress-ng)
// takes on a slow machine.
const DefaultCommissionStall = time.Hour

// commissionStalled fails m's commissioning when nothing was heard of it
// for CommissionStall: not delivered (no discovery agent came), or no test
// reported since the last one or the delivery. The machine stays held
// (a failed commissioning is held until cleared) and the reason says what
// was last heard. It reports whether it failed it.
func (l *Lifecycle) commissionStalled(ctx context.Context, m *inventoryv1.Machine) bool {
	now := l.now()
	if commissionOverdue(m.GetCommission(), now, l.cfg.CommissionStall) == "" {
		return false
	}
	id := m.GetCommission().GetCommissionId()
	fm, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		c := m.GetCommission()
		if !pendingCommission(m) || c.GetCommissionId() != id {
			return errSkip
		}
		reason := commissionOverdue(c, now, l.cfg.CommissionStall)
		if reason == "" {
			return errSkip
		}
		c.Status, c.Error, c.FinishedAt = inventory.CommissionFailed, reason, timestamppb.New(now)
		m.UpdatedAt = timestamppb.New(now)
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("stalled commissioning not recorded", "machine", m.GetName(), "commission_id", id, "err", err)
		}
		return false
	}
	c := fm.GetCommission()
	l.event(fm, "lifecycle", "commission-failed", c.GetError(), commissionAttrs(c))
	l.log.Warn("commissioning stalled: failed", "machine", fm.GetName(), "commission_id", id, "reason", c.GetError())
	return true
}

// commissionOverdue says why commissioning c has stalled at now, or "".
func commissionOverdue(c *inventoryv1.Commission, now time.Time, stall time.Duration) string {
	last := c.GetRequestedAt().AsTime()
	for _, t := range []*timestamppb.Timestamp{c.GetSentAt(), c.GetUpdatedAt()} {
		if t != nil && t.AsTime().After(last) {
			last = t.AsTime()
		}
	}
	if c.GetRequestedAt() == nil || now.Sub(last) <= stall {
		return ""
	}
	switch n := len(c.GetTests()); {
	case c.GetSentAt() == nil:
		return fmt.Sprintf("stalled: not delivered within %s (no discovery agent connected: network-boot the machine, then commission it again)", stall)
	case n == 0:
		return fmt.Sprintf("stalled: no test reported within %s of the plan's delivery", stall)
	default:
		t := c.GetTests()[n-1]
		return fmt.Sprintf("stalled: nothing reported for %s after %d tests (last: %s)", stall, n, termsafe.Escape(strings.TrimSpace(t.GetName()+" "+t.GetTarget())))
	}
}
