package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Reprovision takes a machine back to discovery: refused (ErrPrecondition
// naming them) while its Node holds reservations; otherwise every
// certificate issued for its node is revoked (Config.Certs), its Node is
// removed, boot intent becomes discover, the state DISCOVERED (INVENTORIED
// again when the agent registers) and the install disk is remembered to be
// wiped when the discovery agent's session comes up. With a BMC the
// machine is power-cycled into PXE; otherwise the state reason says the
// operator must reboot it.
func (l *Lifecycle) Reprovision(ctx context.Context, name string) (*inventoryv1.Machine, error) {
	m, err := l.inv.GetMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return nil, apierr.Preconditionf("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
	}
	node, err := l.cfg.Nodes.GetNode(ctx, name)
	hasNode := err == nil
	switch {
	case errors.Is(err, apierr.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		var held []string
		for k := range node.GetReservedComputes() {
			held = append(held, "compute/"+k)
		}
		for k := range node.GetReservedStorages() {
			held = append(held, "storage/"+k)
		}
		if len(held) > 0 {
			sort.Strings(held)
			return nil, apierr.Preconditionf("machine %q: node %s still holds %d reservation(s): %s; delete its VMs and volumes first", name, name, len(held), strings.Join(held, ", "))
		}
	}
	// The node's certificates go before anything else changes: a failure
	// leaves the machine as it was, for a retry.
	if err := l.revokeCerts(ctx, m, "machine reprovisioned"); err != nil {
		return nil, err
	}
	if hasNode {
		if err := l.cfg.Nodes.DeleteNode(ctx, name); err != nil && !errors.Is(err, apierr.ErrNotFound) {
			return nil, fmt.Errorf("machine %q: remove node: %w", name, err)
		}
	}
	bmc := hasBMC(m) && l.cfg.BMC != nil
	reason := "reprovisioning: waiting for the discovery agent"
	if !bmc {
		reason = "reprovisioning: no BMC enrolled: reboot the machine into network boot"
	}
	now := timestamppb.New(l.now())
	m, err = l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if err := inventory.Transition(m, inventory.EventReprovisioned); err != nil {
			return err
		}
		m.StateReason = reason
		m.NodeName = ""
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		m.Watchdog = nil
		if d := m.GetInstall().GetDisk(); d != "" {
			m.Wipe = &inventoryv1.PendingWipe{Disk: d, WipeId: newID(), RequestedAt: now}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	detail := "node removed, boot intent discover"
	if d := m.GetWipe().GetDisk(); d != "" {
		detail += "; " + d + " is wiped when the discovery agent connects"
	}
	l.event(m, "lifecycle", "reprovision", detail, nil)
	l.log.Info("machine reprovisioned", "machine", name, "wipe", m.GetWipe().GetDisk())
	if bmc {
		if err := l.pxeCycle(ctx, m, "reprovision"); err != nil {
			if _, uerr := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
				m.StateReason = "reprovisioning: BMC power cycle failed (" + err.Error() + "): reboot the machine into network boot"
				return nil
			}); uerr != nil {
				l.log.Warn("reprovision: state reason not recorded", "machine", name, "err", uerr)
			}
		} else {
			l.armWatchdog(ctx, name, "reprovision")
		}
	} else {
		l.event(m, "lifecycle", "reboot-needed", reason, nil)
		if l.sess.connected(name) {
			l.sendWipe(ctx, m)
		}
	}
	return l.inv.GetMachine(ctx, name)
}

// revokeCerts revokes every certificate issued for the machine's node (its
// name, and its node name when that differs), when Config.Certs is set.
func (l *Lifecycle) revokeCerts(ctx context.Context, m *inventoryv1.Machine, reason string) error {
	if l.cfg.Certs == nil {
		return nil
	}
	names := []string{m.GetName()}
	if n := m.GetNodeName(); n != "" && n != m.GetName() {
		names = append(names, n)
	}
	for _, n := range names {
		if err := l.cfg.Certs.RevokeNode(ctx, n, reason); err != nil {
			return fmt.Errorf("machine %q: %w", m.GetName(), err)
		}
	}
	return nil
}

// SetMaintenance puts a machine in MAINTENANCE (remembering its state and
// reason; it boots its local disk and no automation touches it) or takes
// it out, restoring them. Taking out a machine not in MAINTENANCE is
// ErrPrecondition.
func (l *Lifecycle) SetMaintenance(ctx context.Context, name string, on bool, reason string) (*inventoryv1.Machine, error) {
	now := timestamppb.New(l.now())
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if on {
			if err := inventory.Transition(m, inventory.EventMaintenanceOn); err != nil {
				return err
			}
			m.StateReason = cmp.Or(reason, "maintenance")
			m.Watchdog = nil
			return nil
		}
		if err := inventory.Transition(m, inventory.EventMaintenanceOff); err != nil {
			return err
		}
		if m.GetState() == inventoryv1.Machine_INSTALLING && m.Install != nil {
			// The install timeout starts afresh.
			m.Install.UpdatedAt = now
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if on {
		l.event(m, "lifecycle", "maintenance-on", m.GetStateReason(), nil)
	} else {
		l.event(m, "lifecycle", "maintenance-off", "state "+m.GetState().String()+" restored", nil)
	}
	l.log.Info("maintenance", "machine", name, "on", on, "state", m.GetState().String())
	return m, nil
}
