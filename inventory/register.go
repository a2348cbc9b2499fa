package inventory

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const (
	serialPrefix = "/inventory/serials/"
	uuidPrefix   = "/inventory/uuids/"
)

// Flags inventory sets on machines.
const (
	FlagDuplicateSerial = "duplicate-serial"
	FlagMACConflict     = "mac-conflict"
)

// Register records a discovery report: it finds the machine serial-first
// (system serial, else system UUID, else any reported MAC), creates it if
// none matches, absorbs MAC-only placeholder machines that DHCP created for
// the same hardware, stores the facts with a dated history of what changed,
// and moves a DISCOVERED machine to INVENTORIED with boot intent `local`.
// Two machines reporting one serial with different UUIDs are kept apart and
// flagged. The BMC LAN address the agent read in-band fills or checks the
// enrolled one (see ReconcileBMCAddress). An invalid report returns
// ErrInvalid and stores nothing.
//
// The machine record changes in one compare-and-swap. hook, when not nil,
// runs inside it after the report is applied (became: the machine just
// became INVENTORIED) and may change the record further; it may run more
// than once when the swap is retried, so it must only set state derived
// from its arguments.
func (i *Inventory) Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts, hook RegisterHook) (*inventoryv1.Machine, error) {
	boot, err := NormalizeMAC(bootMAC)
	if err != nil {
		return nil, fmt.Errorf("boot_mac: %w", err)
	}
	if err := CheckFacts(facts); err != nil {
		return nil, err
	}
	facts = proto.CloneOf(facts)
	macs := []string{boot}
	for _, n := range facts.GetNics() {
		if m, err := NormalizeMAC(n.GetMac()); err == nil && !containsStr(macs, m) {
			macs = append(macs, m)
		}
	}
	serial := strings.TrimSpace(facts.GetSystem().GetSerial())
	if !RealSerial(serial) {
		serial = ""
	}
	uuid := normUUID(facts.GetSystem().GetUuid())
	if !RealUUID(uuid) {
		uuid = ""
	}
	bmcHost := ""
	if addr := facts.GetBmc().GetIpv4Address(); strings.TrimSpace(addr) != "" {
		h, _, err := ParseBMCAddress(addr)
		if err != nil {
			i.log.Warn("in-band BMC address not reconciled", "bmc", addr, "err", err)
		} else {
			bmcHost = h
		}
	}

	target, flags, err := i.identify(ctx, serial, uuid, facts.GetBmc().GetIpv4Address(), macs)
	if err != nil {
		return nil, err
	}
	if target == nil {
		m, err := i.CreateMachine(ctx, &inventoryv1.Machine{Name: MachineNameForMAC(boot), BootMac: boot})
		if errors.Is(err, ErrAlreadyExists) {
			// The MAC-named record exists (another registration raced us).
			m, err = i.GetMachine(ctx, MachineNameForMAC(boot))
		}
		if err != nil {
			return nil, err
		}
		target = m
	}
	name := target.GetName()

	// MACs: claim the reported ones, absorbing DHCP placeholders.
	var newMACs []string
	for _, mac := range macs {
		if hasMAC(target, mac) {
			continue
		}
		owner, err := i.MachineByMAC(ctx, mac)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, err
		case placeholder(owner):
			if err := i.DeleteMachine(ctx, owner.GetName()); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, err
			}
			i.Event(mac, "inventory", "merged", fmt.Sprintf("placeholder machine %s merged into %s", owner.GetName(), name), nil)
		default:
			flags = append(flags, fmt.Sprintf("%s: %s also belongs to machine %s", FlagMACConflict, mac, owner.GetName()))
			continue
		}
		if err := i.claimMAC(ctx, mac, name); err != nil {
			if errors.Is(err, ErrAlreadyExists) {
				flags = append(flags, fmt.Sprintf("%s: %s: %v", FlagMACConflict, mac, err))
				continue
			}
			return nil, err
		}
		newMACs = append(newMACs, mac)
	}

	now := timestamppb.New(i.cfg.Now())
	var changes []*inventoryv1.FactChange
	var became, bmcFilled, bmcMismatch bool
	m, err := i.updateMachine(ctx, name, true, func(m *inventoryv1.Machine) error {
		changes = diffFacts(m.GetFacts(), facts, now)
		m.FactHistory = append(m.FactHistory, changes...)
		if n := len(m.FactHistory); n > maxHistory {
			m.FactHistory = m.FactHistory[n-maxHistory:]
		}
		m.Facts = facts
		if serial != "" {
			m.Serial = serial
		}
		if uuid != "" {
			m.SystemUuid = uuid
		}
		for _, mac := range newMACs {
			if !containsStr(m.Macs, mac) {
				m.Macs = append(m.Macs, mac)
			}
		}
		m.BootMac = boot
		if !containsStr(m.Macs, boot) {
			// The boot MAC is claimed by someone else: keep our record's
			// MAC list honest, but remember where we booted from.
			m.BootMac = m.GetMacs()[0]
		}
		m.Flags = mergeFlags(m.GetFlags(), flags)
		// The discovery agent came up: whatever powered the machine on
		// booted it.
		m.Watchdog = nil
		became = false
		switch m.GetState() {
		case inventoryv1.Machine_UNSPECIFIED, inventoryv1.Machine_DISCOVERED:
			became = true
			m.State = inventoryv1.Machine_INVENTORIED
			m.StateReason = ""
			if m.GetBootIntent() == inventoryv1.BootIntent_BOOT_INTENT_DISCOVER || m.GetBootIntent() == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED {
				m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
			}
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[AnnotationLastSeen] = now.AsTime().UTC().Format("2006-01-02T15:04:05Z")
		bmcFilled, bmcMismatch = false, false
		if bmcHost != "" {
			// Fill the enrolled BMC address from what the machine
			// reports in-band, or flag a mismatch.
			bmcFilled, bmcMismatch = applyInbandBMC(m, bmcHost)
		}
		if hook != nil {
			hook(m, became)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if bmcHost != "" {
		i.inbandBMCEvents(m, bmcHost, bmcFilled, bmcMismatch)
	}
	if serial != "" {
		i.index(ctx, serialPrefix+url.PathEscape(serial), name)
	}
	if uuid != "" {
		i.index(ctx, uuidPrefix+uuid, name)
	}
	detail := fmt.Sprintf("machine %s serial=%q uuid=%q macs=%d", name, serial, uuid, len(macs))
	i.Event(boot, "inventory", "registered", detail, map[string]string{"state": m.GetState().String(), "changes": fmt.Sprint(len(changes))})
	i.log.Info("machine registered", "machine", name, "serial", serial, "mac", boot, "state", m.GetState().String(), "fact_changes", len(changes))
	return m, nil
}

// RegisterHook is called inside Register's machine mutation; see Register.
type RegisterHook func(m *inventoryv1.Machine, became bool)

// AnnotationLastSeen is when the machine's agent last reported.
const AnnotationLastSeen = "corral/last_seen"

// placeholder reports whether m is a record DHCP made for an unknown MAC
// and nothing else has touched: it may be merged into a registered machine.
func placeholder(m *inventoryv1.Machine) bool {
	return m.GetSerial() == "" && m.GetSystemUuid() == "" && m.GetFacts() == nil &&
		m.GetBmc() == nil && m.GetState() == inventoryv1.Machine_DISCOVERED
}

// identify finds the machine a report belongs to: by serial, then UUID,
// then MAC. A serial already held by a machine with a different real UUID
// is a duplicate: both are flagged and the report is matched by UUID only.
func (i *Inventory) identify(ctx context.Context, serial, uuid, bmcHost string, macs []string) (*inventoryv1.Machine, []string, error) {
	var flags []string
	if serial != "" {
		m, err := i.lookupIndex(ctx, serialPrefix+url.PathEscape(serial))
		if err != nil {
			return nil, nil, err
		}
		if m != nil {
			if uuid == "" || m.GetSystemUuid() == "" || normUUID(m.GetSystemUuid()) == uuid {
				return m, nil, nil
			}
			flag := fmt.Sprintf("%s: serial %q is also reported by machine %s (uuid %s)", FlagDuplicateSerial, serial, m.GetName(), m.GetSystemUuid())
			flags = append(flags, flag)
			other := m.GetName()
			if _, err := i.UpdateMachine(ctx, other, func(o *inventoryv1.Machine) error {
				o.Flags = mergeFlags(o.GetFlags(), []string{fmt.Sprintf("%s: serial %q is also reported by a machine with uuid %s", FlagDuplicateSerial, serial, uuid)})
				return nil
			}); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, nil, err
			}
		}
	}
	if uuid != "" {
		m, err := i.lookupIndex(ctx, uuidPrefix+uuid)
		if err != nil || m != nil {
			return m, flags, err
		}
	}
	// A machine enrolled by its BMC before it ever booted is found by the
	// BMC LAN address the agent reads in-band, as long as no other
	// identity of its own contradicts the report.
	if bmcHost != "" {
		for _, port := range []uint32{623, 443} {
			var b inventoryv1.BmcAddressBinding
			if _, err := record.Get(ctx, i.cfg.Store, bmcKey(bmcHost, port), &b); err != nil {
				continue
			}
			m, err := i.GetMachine(ctx, b.GetMachineName())
			if err != nil {
				continue
			}
			if m.GetSerial() == "" && m.GetSystemUuid() == "" {
				return m, flags, nil
			}
		}
	}
	for _, mac := range macs {
		m, err := i.MachineByMAC(ctx, mac)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		// A MAC match only identifies a machine that has no conflicting
		// identity of its own.
		if (serial == "" || m.GetSerial() == "" || m.GetSerial() == serial) && (uuid == "" || m.GetSystemUuid() == "" || normUUID(m.GetSystemUuid()) == uuid) {
			return m, flags, nil
		}
	}
	return nil, flags, nil
}

func (i *Inventory) lookupIndex(ctx context.Context, key string) (*inventoryv1.Machine, error) {
	var b inventoryv1.MacBinding
	if _, err := record.Get(ctx, i.cfg.Store, key, &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	m, err := i.GetMachine(ctx, b.GetMachineName())
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	return m, err
}

// index points key at machine unless a live machine already holds it.
func (i *Inventory) index(ctx context.Context, key, machine string) {
	_, err := record.Update(ctx, i.cfg.Store, key, func() *inventoryv1.MacBinding { return &inventoryv1.MacBinding{} },
		func(b *inventoryv1.MacBinding, exists bool) (bool, error) {
			if exists && b.GetMachineName() != machine {
				if _, err := i.GetMachine(ctx, b.GetMachineName()); err == nil {
					return false, errSkip
				}
			}
			if exists && b.GetMachineName() == machine {
				return false, errSkip
			}
			b.MachineName = machine
			return false, nil
		})
	if err != nil && !errors.Is(err, errSkip) {
		i.log.Warn("could not index machine", "key", key, "machine", machine, "err", err)
	}
}

func mergeFlags(have, add []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range append(append([]string{}, have...), add...) {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}
