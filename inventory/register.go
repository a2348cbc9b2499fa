package inventory

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const (
	serialPrefix = store.SerialsPrefix
	uuidPrefix   = store.UUIDsPrefix
)

// Flags inventory sets on machines.
const (
	FlagDuplicateSerial = "duplicate-serial"
	FlagMACConflict     = "mac-conflict"
)

// Register records a discovery report: it finds the machine serial-first
// (system serial, else system UUID, else the in-band BMC address of a
// machine enrolled before it booted, else any reported MAC), creates it if
// none matches, absorbs MAC-only placeholder machines that DHCP created for
// the same hardware, stores the facts with a dated history of what changed,
// and moves a DISCOVERED machine to INVENTORIED with boot intent `local`.
// Two machines reporting one serial with different UUIDs are kept apart and
// flagged. The BMC LAN address the agent read in-band fills or checks the
// enrolled one (see ReconcileBMCAddress). An invalid report returns
// apierr.ErrInvalid and stores nothing.
//
// A known machine is never taken over. A report is refused (an error of
// class apierr.ErrPermissionDenied naming the machine and what mismatched,
// recorded on that machine's timeline, nothing of it changed) when the
// machine holding its boot MAC, or the one it would land on, has a real
// serial or system UUID recorded and the report carries neither of them
// or contradicts one (IdentityMismatch). A NIC MAC of the report held by
// such a machine is not claimed: the report's own machine is flagged
// mac-conflict instead (a separate, flagged record, never merged). DHCP
// placeholders (no serial, no UUID, no facts) are absorbed. The residual
// risk: a machine record with no real serial and no real UUID — a
// placeholder, or a machine whose firmware reports none — is claimed by
// any report from one of its MACs.
//
// opts.Admit, when set, sees the match before anything is written and may
// refuse it. The machine record changes in one compare-and-swap; opts.Hook,
// when set, runs inside it after the report is applied (became: the
// machine just became INVENTORIED) and may change the record further; it
// may run more than once when the swap is retried, so it must only set
// state derived from its arguments.
func (i *Inventory) Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts, opts RegisterOptions) (*inventoryv1.Machine, error) {
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
		if m, err := NormalizeMAC(n.GetMac()); err == nil && !slices.Contains(macs, m) {
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

	target, by, flags, dups, err := i.identify(ctx, serial, uuid, bmcHost, macs)
	if err != nil {
		return nil, err
	}
	// The machine that holds the boot MAC must recognise the report (read
	// again only when it is not the one identify found).
	var holder *inventoryv1.Machine
	if target != nil && hasMAC(target, boot) {
		holder = target
	} else {
		holder, err = i.MachineByMAC(ctx, boot)
		switch {
		case errors.Is(err, apierr.ErrNotFound):
			holder = nil
		case err != nil:
			return nil, err
		}
	}
	if holder != nil {
		if why := IdentityMismatch(holder, serial, uuid); why != "" {
			return nil, i.refuseReport(holder, boot, serial, uuid, why)
		}
	}
	if target == nil {
		// The name a new machine gets may be taken by a record that no
		// longer holds the MAC (or one a concurrent registration just
		// made): it must recognise the report like any other.
		name := MachineNameForMAC(boot)
		existing, err := i.GetMachine(ctx, name)
		switch {
		case errors.Is(err, apierr.ErrNotFound):
			by = "new"
		case err != nil:
			return nil, err
		default:
			if why := IdentityMismatch(existing, serial, uuid); why != "" {
				return nil, i.refuseReport(existing, boot, serial, uuid, why)
			}
			target, by = existing, "name"
		}
	} else if why := IdentityMismatch(target, serial, uuid); why != "" {
		return nil, i.refuseReport(target, boot, serial, uuid, why)
	}
	match := Match{Machine: target, By: by, Holder: holder, Identified: true}
	if target == nil {
		match.Name = MachineNameForMAC(boot)
	} else {
		match.Name = target.GetName()
	}
	if opts.Admit != nil {
		if err := opts.Admit(match); err != nil {
			return nil, err
		}
	}
	for _, d := range dups {
		if _, err := i.UpdateMachine(ctx, d.machine, func(o *inventoryv1.Machine) error {
			o.Flags = mergeFlags(o.GetFlags(), []string{d.flag})
			return nil
		}); err != nil && !errors.Is(err, apierr.ErrNotFound) {
			return nil, err
		}
	}
	if target == nil {
		m, err := i.CreateMachine(ctx, &inventoryv1.Machine{Name: match.Name, BootMac: boot})
		if errors.Is(err, apierr.ErrAlreadyExists) {
			// Another registration created it between our read and
			// now: the mutation below re-checks its identity.
			m, err = i.GetMachine(ctx, match.Name)
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
		case errors.Is(err, apierr.ErrNotFound):
		case err != nil:
			return nil, err
		case placeholder(owner):
			if err := i.DeleteMachine(ctx, owner.GetName()); err != nil && !errors.Is(err, apierr.ErrNotFound) {
				return nil, err
			}
			i.Event(mac, "inventory", "merged", fmt.Sprintf("placeholder machine %s merged into %s", owner.GetName(), name), nil)
		default:
			flags = append(flags, fmt.Sprintf("%s: %s also belongs to machine %s", FlagMACConflict, mac, owner.GetName()))
			continue
		}
		if err := i.claimMAC(ctx, mac, name); err != nil {
			if errors.Is(err, apierr.ErrAlreadyExists) {
				flags = append(flags, fmt.Sprintf("%s: %s: %v", FlagMACConflict, mac, err))
				continue
			}
			return nil, err
		}
		newMACs = append(newMACs, mac)
	}

	// The serial and UUID index records are written before the machine
	// record (the store has no multi-key transaction): a record the
	// machine does not come to agree with is ignored by its readers and
	// taken over by the next writer (docs/architecture.md, "Index
	// records").
	if serial != "" {
		i.index(ctx, serialPrefix+url.PathEscape(serial), name, hasSerial(serial))
	}
	if uuid != "" {
		i.index(ctx, uuidPrefix+uuid, name, hasUUID(uuid))
	}
	now := timestamppb.New(i.cfg.Now())
	var changes []*inventoryv1.FactChange
	var became, bmcFilled, bmcMismatch bool
	var refused *inventoryv1.Machine
	var refusedWhy string
	m, err := i.updateMachine(ctx, name, true, func(m *inventoryv1.Machine) error {
		// Re-checked on the record being written: another report may have
		// recorded an identity since we matched.
		if why := IdentityMismatch(m, serial, uuid); why != "" {
			refused, refusedWhy = m, why
			return errRefused
		}
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
			if !slices.Contains(m.Macs, mac) {
				m.Macs = append(m.Macs, mac)
			}
		}
		m.BootMac = boot
		if !slices.Contains(m.Macs, boot) {
			// The boot MAC is claimed by someone else: keep our record's
			// MAC list honest, but remember where we booted from.
			m.BootMac = m.GetMacs()[0]
		}
		m.Flags = mergeFlags(m.GetFlags(), flags)
		// The discovery agent came up: whatever powered the machine on
		// booted it — unless its install is done: then it is the agent
		// that installed, registering again because its session broke
		// before the reboot or kexec into the hypervisor image, and the
		// watchdog keeps waiting for the node (lifecycle/kexec.go).
		if m.GetState() != inventoryv1.Machine_INSTALLING || !m.GetInstall().GetDone() {
			m.Watchdog = nil
		}
		from := m.GetState()
		if err := Transition(m, EventRegistered); err != nil {
			return err
		}
		became = m.GetState() != from
		if became {
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
		if opts.Hook != nil {
			opts.Hook(m, became)
		}
		return nil
	})
	if err != nil {
		// The MACs claimed for the report go back (those the record
		// lists meanwhile stay bound).
		i.releaseMACs(ctx, name, newMACs)
	}
	if errors.Is(err, errRefused) {
		return nil, i.refuseReport(refused, boot, serial, uuid, refusedWhy)
	}
	if err != nil {
		return nil, err
	}
	if bmcHost != "" {
		i.inbandBMCEvents(m, bmcHost, bmcFilled, bmcMismatch)
	}
	detail := fmt.Sprintf("machine %s serial=%q uuid=%q macs=%d", name, serial, uuid, len(macs))
	i.Event(boot, "inventory", "registered", detail, map[string]string{"state": m.GetState().String(), "changes": fmt.Sprint(len(changes)), "matched_by": by})
	i.log.Info("machine registered", "machine", name, "serial", serial, "mac", boot, "state", m.GetState().String(), "fact_changes", len(changes), "matched_by", by)
	return m, nil
}

// RegisterOptions are the optional parts of Register.
type RegisterOptions struct {
	// Admit, when set, is called once the report has been matched to a
	// machine, before anything is written; an error refuses the report
	// (Register returns it as is and changes nothing).
	Admit func(Match) error
	// Hook runs inside the machine mutation; see Register.
	Hook RegisterHook
}

// Match is the machine a discovery report was matched to, as Admit sees it.
type Match struct {
	// Name is the machine the report lands on; Machine is its record as
	// read (nil when a new machine of that name will be created).
	Name    string
	Machine *inventoryv1.Machine
	// By says how it was found: "serial", "uuid", "bmc" (the in-band BMC
	// address of a machine enrolled before it booted), "mac", "name" (the
	// record named after the boot MAC) or "new".
	By string
	// Holder is the machine that held the boot MAC before the report (nil
	// when none did); a DHCP placeholder holder is absorbed.
	Holder *inventoryv1.Machine
	// Identified is always true for a match Register admits: the machine
	// either had no real serial or UUID recorded, or the report carries one
	// it has and contradicts none (IdentityMismatch). It is spelled out so
	// that callers gating on it (install plans) say so.
	Identified bool
}

// Placeholder reports whether m is a record DHCP made for an unknown MAC
// and nothing else has touched: it may be merged into a registered machine.
func Placeholder(m *inventoryv1.Machine) bool { return placeholder(m) }

// errRefused aborts Register's mutation on an identity mismatch.
var errRefused = errors.New("report refused")

// IdentityMismatch compares a report's identity — its real serial and
// system UUID, "" where it has none (RealSerial, RealUUID; the UUID
// lower-cased) — with what m has recorded. It returns "" when the report
// may land on m: m has neither a serial nor a UUID recorded, or the report
// carries at least one of those m has, equal, and contradicts neither.
// Otherwise it says what mismatched, for an error and the timeline.
func IdentityMismatch(m *inventoryv1.Machine, serial, uuid string) string {
	ms, mu := m.GetSerial(), normUUID(m.GetSystemUuid())
	if ms == "" && mu == "" {
		return ""
	}
	var bad []string
	if ms != "" && serial != "" && serial != ms {
		bad = append(bad, fmt.Sprintf("serial %q is not the recorded %q", serial, ms))
	}
	if mu != "" && uuid != "" && uuid != mu {
		bad = append(bad, fmt.Sprintf("system UUID %s is not the recorded %s", uuid, mu))
	}
	if len(bad) > 0 {
		return strings.Join(bad, ", ")
	}
	if (ms != "" && serial == ms) || (mu != "" && uuid == mu) {
		return ""
	}
	var have []string
	if ms != "" {
		have = append(have, fmt.Sprintf("serial %q", ms))
	}
	if mu != "" {
		have = append(have, "system UUID "+mu)
	}
	return "the report carries no " + strings.Join(have, " or ") + " (it has " + describeIdentity(serial, uuid) + ")"
}

func describeIdentity(serial, uuid string) string {
	switch {
	case serial != "" && uuid != "":
		return fmt.Sprintf("serial %q, system UUID %s", serial, uuid)
	case serial != "":
		return fmt.Sprintf("serial %q and no system UUID", serial)
	case uuid != "":
		return "no serial, system UUID " + uuid
	}
	return "no real serial and no real system UUID"
}

// refuseReport records a refused report on m's timeline (by the boot MAC
// when m holds it, else by m's own MAC) and returns the PermissionDenied
// error naming m and the mismatch.
func (i *Inventory) refuseReport(m *inventoryv1.Machine, boot, serial, uuid, why string) error {
	name := m.GetName()
	mac := boot
	if !hasMAC(m, boot) {
		mac = firstMAC(m)
	}
	detail := fmt.Sprintf("report from %s refused: machine %s: %s", boot, name, why)
	if mac != "" {
		i.Event(mac, "inventory", "register-refused", detail, map[string]string{"boot_mac": boot, "serial": serial, "uuid": uuid})
	}
	if n, ok := i.refusals.Allow(); ok {
		i.log.Warn("discovery report refused: identity mismatch", "machine", name, "mac", boot, "serial", serial, "reason", why, "suppressed", n)
	}
	return apierr.PermissionDeniedf("machine %s does not match the report from %s: %s; if the hardware really changed, delete the machine first", name, boot, why)
}

func firstMAC(m *inventoryv1.Machine) string {
	if m.GetBootMac() != "" {
		return m.GetBootMac()
	}
	if len(m.GetMacs()) > 0 {
		return m.GetMacs()[0]
	}
	return ""
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

// dupFlag is a duplicate-serial flag identify wants set on another
// machine once the report is admitted.
type dupFlag struct{ machine, flag string }

// identify finds the machine a report belongs to and says how: by serial,
// then UUID, then the in-band BMC address, then MAC. A serial already held
// by a machine with a different real UUID is a duplicate: both are flagged
// (the other one through dups, written by the caller once the report is
// admitted) and the report is matched by UUID only. A MAC match only
// identifies a machine whose recorded identity the report does not lack or
// contradict. It writes nothing.
func (i *Inventory) identify(ctx context.Context, serial, uuid, bmcHost string, macs []string) (*inventoryv1.Machine, string, []string, []dupFlag, error) {
	var flags []string
	var dups []dupFlag
	if serial != "" {
		m, err := i.lookupIndex(ctx, serialPrefix+url.PathEscape(serial), hasSerial(serial))
		if err != nil {
			return nil, "", nil, nil, err
		}
		if m != nil {
			if uuid == "" || m.GetSystemUuid() == "" || normUUID(m.GetSystemUuid()) == uuid {
				return m, "serial", nil, nil, nil
			}
			flags = append(flags, fmt.Sprintf("%s: serial %q is also reported by machine %s (uuid %s)", FlagDuplicateSerial, serial, m.GetName(), m.GetSystemUuid()))
			dups = append(dups, dupFlag{machine: m.GetName(), flag: fmt.Sprintf("%s: serial %q is also reported by a machine with uuid %s", FlagDuplicateSerial, serial, uuid)})
		}
	}
	if uuid != "" {
		m, err := i.lookupIndex(ctx, uuidPrefix+uuid, hasUUID(uuid))
		if err != nil {
			return nil, "", nil, nil, err
		}
		if m != nil {
			return m, "uuid", flags, dups, nil
		}
	}
	// A machine enrolled by its BMC before it ever booted is found by the
	// BMC LAN address the agent reads in-band, as long as no other
	// identity of its own contradicts the report.
	if bmcHost != "" {
		for _, port := range []uint32{623, 443} {
			var b inventoryv1.BmcAddressBinding
			if _, err := record.Get(ctx, i.cfg.Store, BMCAddressKey(bmcHost, port), &b); err != nil {
				continue
			}
			m, err := i.GetMachine(ctx, b.GetMachineName())
			if err != nil || m.GetBmc().GetAddress() != bmcHost {
				continue // a binding its machine does not agree with
			}
			if m.GetSerial() == "" && m.GetSystemUuid() == "" {
				return m, "bmc", flags, dups, nil
			}
		}
	}
	for _, mac := range macs {
		m, err := i.MachineByMAC(ctx, mac)
		if errors.Is(err, apierr.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, "", nil, nil, err
		}
		if IdentityMismatch(m, serial, uuid) == "" {
			return m, "mac", flags, dups, nil
		}
	}
	return nil, "", flags, dups, nil
}

// hasSerial and hasUUID say whether a machine agrees with a serial or
// UUID index record: it has that serial or UUID recorded.
func hasSerial(serial string) func(*inventoryv1.Machine) bool {
	return func(m *inventoryv1.Machine) bool { return m.GetSerial() == serial }
}

func hasUUID(uuid string) func(*inventoryv1.Machine) bool {
	return func(m *inventoryv1.Machine) bool { return normUUID(m.GetSystemUuid()) == uuid }
}

// lookupIndex returns the machine a serial or UUID index record names,
// or nil when there is none, it is gone, or it does not agree with the
// record (the index is written before the machine, so it may name a
// machine whose write failed or has not happened yet).
func (i *Inventory) lookupIndex(ctx context.Context, key string, agrees func(*inventoryv1.Machine) bool) (*inventoryv1.Machine, error) {
	var b inventoryv1.MacBinding
	if _, err := record.Get(ctx, i.cfg.Store, key, &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	m, err := i.GetMachine(ctx, b.GetMachineName())
	if errors.Is(err, apierr.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !agrees(m) {
		return nil, nil
	}
	return m, nil
}

// index points key at machine unless a live machine that agrees with it
// already holds it.
func (i *Inventory) index(ctx context.Context, key, machine string, agrees func(*inventoryv1.Machine) bool) {
	_, err := record.Update(ctx, i.cfg.Store, key, func() *inventoryv1.MacBinding { return &inventoryv1.MacBinding{} },
		func(b *inventoryv1.MacBinding, exists bool) (bool, error) {
			if exists && b.GetMachineName() != machine {
				if m, err := i.GetMachine(ctx, b.GetMachineName()); err == nil && agrees(m) {
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
