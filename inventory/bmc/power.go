// Power: reading and setting a machine's power and next boot device
// through its BMC, and the poller's list of machines to read.

package bmc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// GetPower reads a machine's power state from its BMC, stores it (with
// the time read and the provider that answered) and records a change in
// the timeline.
func (c *Service) GetPower(ctx context.Context, name string) (*inventoryv1.PowerStatus, error) {
	m, t, err := c.target(ctx, name)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	st, res, err := c.cfg.Driver.PowerState(cctx, t)
	cancel()
	c.noteCertificate(ctx, m, res)
	if err != nil {
		return nil, fmt.Errorf("machine %s: %w", name, err)
	}
	return c.storePower(ctx, m, st, res)
}

func (c *Service) storePower(ctx context.Context, m *inventoryv1.Machine, st inventoryv1.PowerState, res Result) (*inventoryv1.PowerStatus, error) {
	now := timestamppb.New(c.cfg.Now())
	var before inventoryv1.PowerState
	nm, err := c.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		before = m.GetPowerState()
		m.PowerState, m.PowerReadAt = st, now
		if m.Bmc != nil && res.Provider != "" {
			m.Bmc.Provider = res.Provider
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if before != st {
		c.event(nm, "power-changed", fmt.Sprintf("power %s -> %s", powerName(before), powerName(st)), res)
		c.log.Info("power changed", "machine", nm.GetName(), "state", powerName(st), "was", powerName(before), "provider", res.Provider)
	}
	return &inventoryv1.PowerStatus{State: st, ReadAt: now, Provider: res.Provider, Attempts: res.Attempts, Note: res.Note}, nil
}

// SetPower performs a power action through the machine's BMC, records it
// in the timeline, and then reads and stores the state. (The lifecycle
// arms the boot watchdog for actions that boot the machine.)
func (c *Service) SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error) {
	if _, ok := inventoryv1.PowerAction_name[int32(a)]; !ok || a == inventoryv1.PowerAction_POWER_ACTION_UNSPECIFIED {
		return nil, apierr.Invalidf("power action %d: use on, off, soft, cycle or reset", int32(a))
	}
	m, t, err := c.target(ctx, name)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	res, err := c.cfg.Driver.SetPower(cctx, t, a)
	cancel()
	c.noteCertificate(ctx, m, res)
	verb := strings.ToLower(strings.TrimPrefix(a.String(), "POWER_ACTION_"))
	if err != nil {
		c.event(m, "power-failed", fmt.Sprintf("power %s failed: %v", verb, err), res)
		return nil, fmt.Errorf("machine %s: power %s: %w", name, verb, err)
	}
	c.event(m, "power-"+verb, fmt.Sprintf("power %s via %s", verb, res.Provider), res)
	// Read back (one more BMC round trip); a cycle may still read off.
	cctx, cancel = context.WithTimeout(ctx, t.Timeout)
	st, rres, err := c.cfg.Driver.PowerState(cctx, t)
	cancel()
	if err != nil {
		return &inventoryv1.PowerStatus{State: inventoryv1.PowerState_POWER_STATE_UNKNOWN, Provider: res.Provider, Attempts: res.Attempts, Note: res.Note}, nil //nolint:nilerr // the action succeeded; only its read-back failed, so the state is UNKNOWN
	}
	ps, err := c.storePower(ctx, m, st, rres)
	if err != nil {
		return nil, err
	}
	ps.Provider, ps.Attempts, ps.Note = res.Provider, res.Attempts, res.Note
	return ps, nil
}

// SetBootDevice sets a machine's next boot device through its BMC and
// records it in the timeline.
func (c *Service) SetBootDevice(ctx context.Context, name string, req inventory.BootRequest) error {
	if _, ok := inventoryv1.BootDevice_name[int32(req.Device)]; !ok || req.Device == inventoryv1.BootDevice_BOOT_DEVICE_UNSPECIFIED {
		return apierr.Invalidf("boot device %d: use pxe, disk or bios", int32(req.Device))
	}
	m, t, err := c.target(ctx, name)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	res, err := c.cfg.Driver.SetBootDevice(cctx, t, req)
	cancel()
	c.noteCertificate(ctx, m, res)
	dev := strings.ToLower(strings.TrimPrefix(req.Device.String(), "BOOT_DEVICE_"))
	if err != nil {
		c.event(m, "bootdev-failed", fmt.Sprintf("boot device %s failed: %v", dev, err), res)
		return fmt.Errorf("machine %s: boot device %s: %w", name, dev, err)
	}
	c.event(m, "bootdev", fmt.Sprintf("next boot %s (persistent=%t efi=%t) via %s", dev, req.Persistent, req.EFI, res.Provider), res)
	if _, err := c.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.Bmc == nil || res.Provider == "" || m.Bmc.GetProvider() == res.Provider {
			return errSkip // nothing new to record
		}
		m.Bmc.Provider = res.Provider
		return nil
	}); err != nil && !errors.Is(err, errSkip) {
		return err
	}
	return nil
}

// PowerTargets names the machines with an enrolled BMC (for the poller).
// When the inventory can scan (machineScanner, as *inventory.Inventory
// does) it keeps only the names, a batch of records at a time: a poll of
// 50,000 machines never holds every record.
func (c *Service) PowerTargets(ctx context.Context) ([]string, error) {
	req := &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
	var out []string
	keep := func(m *inventoryv1.Machine) error {
		if m.GetBmc().GetAddress() != "" && m.GetBmc().GetUsername() != "" {
			out = append(out, m.GetName())
		}
		return nil
	}
	if s, ok := c.inv.(machineScanner); ok {
		if err := s.EachMachine(ctx, req, keep); err != nil {
			return nil, err
		}
		return out, nil
	}
	ms, err := c.inv.ListMachines(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		_ = keep(m) // keep returns no error
	}
	return out, nil
}

// machineScanner is implemented by an inventory that scans machines a
// bounded batch at a time (*inventory.Inventory).
type machineScanner interface {
	EachMachine(ctx context.Context, req *inventoryv1.ListMachinesRequest, fn func(*inventoryv1.Machine) error) error
}

// RefreshPower reads and stores one machine's power state (for the
// poller). A BMC that cannot be read leaves the state UNKNOWN (recorded
// once as a change) and returns the error.
func (c *Service) RefreshPower(ctx context.Context, name string) error {
	_, err := c.GetPower(ctx, name)
	if err == nil || errors.Is(err, apierr.ErrNotFound) || errors.Is(err, apierr.ErrPrecondition) {
		return err
	}
	if m, gerr := c.inv.GetMachine(context.WithoutCancel(ctx), name); gerr == nil {
		_, _ = c.storePower(context.WithoutCancel(ctx), m, inventoryv1.PowerState_POWER_STATE_UNKNOWN, Result{Note: err.Error()})
	}
	return err
}
