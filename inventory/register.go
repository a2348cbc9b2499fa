package inventory

import (
	"context"
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
	ekPrefix     = store.EKsPrefix
)

// Flags inventory sets on machines.
const (
	FlagDuplicateSerial = "duplicate-serial"
	FlagMACConflict     = "mac-conflict"
)

// Register records a discovery report under the claim rules (claims.go,
// docs/security.md "Claims"): the report lands on the machine whose boot
// MAC it comes from when it carries every identifier that machine holds;
// else on the machine its serial, system UUID or TPM key names when it
// also shows evidence (a MAC that machine listed, or its bound TPM key);
// else, when it names nobody, on a new machine (absorbing the DHCP
// placeholder of its boot MAC). Anything else — an identity that does not
// match, a claim without evidence, a BMC address that belongs to another
// machine — parks the report as a record of its own in CONFLICT
// (ConflictName) and returns ErrParked: nothing of the claimed machine
// changes, both sides get a timeline entry, and an operator adopts or
// rejects it.
//
// Landing stores the facts with a dated history, fills the identity the
// machine lacks, binds the boot MAC (only the boot MAC: the other MACs of
// a report stay facts), and moves a DISCOVERED machine to INVENTORIED with
// boot intent local. The machine record, its MAC binding, its serial,
// UUID and TPM key index records and an absorbed placeholder change in one
// store transaction. An invalid report returns apierr.ErrInvalid; a new
// machine past the cap on machines waiting to be accepted returns
// ErrUnacceptedCap; both store nothing.
//
// opts.Admit, when set, sees a landing before anything is written and may
// refuse it (it is not asked about a parked report). opts.Hook, when set,
// runs inside the transaction after the report is applied (became: the
// machine just became INVENTORIED) and may change the record further. The
// transaction may run more than once when it conflicts, so both must only
// derive what they do from their arguments.
func (i *Inventory) Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts, opts RegisterOptions) (*inventoryv1.Machine, error) {
	boot, err := NormalizeMAC(bootMAC)
	if err != nil {
		return nil, fmt.Errorf("boot_mac: %w", err)
	}
	if err := i.CheckReport(boot, facts); err != nil {
		return nil, err
	}
	facts = proto.CloneOf(facts)
	id := reportIdentity(facts, opts.EKIdentity)
	bmcHost := ""
	if addr := facts.GetBmc().GetIpv4Address(); strings.TrimSpace(addr) != "" {
		h, _, err := ParseBMCAddress(addr)
		if err != nil {
			i.log.Warn("in-band BMC address not reconciled", "bmc", addr, "err", err)
		} else {
			bmcHost = h
		}
	}
	r := &registration{i: i, boot: boot, facts: facts, id: id, bmcHost: bmcHost, opts: opts, now: timestamppb.New(i.cfg.Now())}
	defer r.releaseSlot()
	_, err = record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		r.reset()
		return r.run(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	for _, w := range r.written {
		i.observe(w.name, w.m)
	}
	if r.parked != nil {
		return nil, i.parkedEvents(r)
	}
	m := r.out
	if r.absorbed != "" && r.absorbed != m.GetName() {
		i.Event(boot, "inventory", "merged", fmt.Sprintf("placeholder machine %s merged into %s", r.absorbed, m.GetName()), nil)
	}
	if bmcHost != "" {
		i.inbandBMCEvents(m, bmcHost, r.bmcFilled, r.bmcMismatch)
	}
	detail := fmt.Sprintf("machine %s %s from %s", m.GetName(), id.describe(), boot)
	i.Event(boot, "inventory", "registered", detail, map[string]string{"state": m.GetState().String(), "changes": fmt.Sprint(r.changes), "matched_by": r.by,
		"secure_boot": SecureBootText(m.GetFacts())})
	i.log.Info("machine registered", "machine", m.GetName(), "serial", id.serial, "mac", boot, "state", m.GetState().String(), "fact_changes", r.changes, "matched_by", r.by, "tpm", id.ek != "")
	return m, nil
}

// ErrParked is returned by Register for a report parked in CONFLICT
// (class apierr.ErrPermissionDenied: the agent is not the machine it
// claimed to be until an operator says so).
var ErrParked = apierr.New(apierr.ErrPermissionDenied, "inventory: report parked in CONFLICT")

// registration is one Register's transaction state.
type registration struct {
	i       *Inventory
	boot    string
	facts   *inventoryv1.Facts
	id      identity
	bmcHost string
	opts    RegisterOptions
	now     *timestamppb.Timestamp

	slot func() // a reserved slot under the unaccepted cap, released after

	// Results of the last attempt.
	out                    *inventoryv1.Machine
	by                     string
	parked                 *inventoryv1.Machine
	claimed                *inventoryv1.Machine // the machine a parked report claimed
	absorbed               string
	changes                int
	bmcFilled, bmcMismatch bool
	written                []written
}

type written struct {
	name string
	m    *inventoryv1.Machine // nil: deleted
}

func (r *registration) reset() {
	r.out, r.by, r.parked, r.claimed, r.absorbed = nil, "", nil, nil, ""
	r.changes, r.bmcFilled, r.bmcMismatch, r.written = 0, false, false, nil
}

func (r *registration) releaseSlot() {
	if r.slot != nil {
		r.slot()
	}
}

// reserve takes a slot under the unaccepted cap once per Register.
func (r *registration) reserve(ctx context.Context) error {
	if r.slot != nil {
		return nil
	}
	release, err := r.i.reserveUnaccepted(ctx, r.boot)
	if err != nil {
		return err
	}
	r.slot = release
	return nil
}

// run decides where the report goes and writes it through tx.
func (r *registration) run(ctx context.Context, tx *record.Tx) error {
	holder, err := txMachineByMAC(ctx, tx, r.boot)
	if err != nil {
		return err
	}
	var absorb *inventoryv1.Machine
	if holder != nil && placeholder(holder) {
		absorb, holder = holder, nil
	}
	switch {
	case holder != nil && holder.GetState() == inventoryv1.Machine_CONFLICT:
		// Parked before and not decided yet: it stays parked.
		var claimed *inventoryv1.Machine
		if n := holder.GetConflict().GetMachine(); n != "" {
			if claimed, err = txMachine(ctx, tx, n); err != nil {
				return err
			}
		}
		return r.park(ctx, tx, holder, nil, claimed, holder.GetConflict().GetReason())
	case holder != nil:
		if why := r.id.mismatch(holder); why != "" {
			return r.park(ctx, tx, nil, nil, holder, fmt.Sprintf("the report comes from machine %s's boot MAC, but %s", holder.GetName(), why))
		}
		// An identifier the holder lacks may not be another machine's.
		for _, ix := range r.indexes() {
			if ix.agrees(holder) {
				continue
			}
			other, err := txIndexed(ctx, tx, ix.key, ix.agrees)
			if err != nil {
				return err
			}
			if other != nil && other.GetName() != holder.GetName() {
				return r.park(ctx, tx, nil, nil, other, fmt.Sprintf("its %s names machine %s, but it comes from machine %s's boot MAC", ix.by, other.GetName(), holder.GetName()))
			}
		}
		return r.land(ctx, tx, holder, "mac", holder, nil)
	}
	cands, err := r.candidates(ctx, tx, absorb)
	if err != nil {
		return err
	}
	for _, c := range cands {
		if r.id.mismatch(c.m) == "" && r.id.evidence(c.m, r.boot) {
			return r.land(ctx, tx, c.m, c.by, nil, absorb)
		}
	}
	if len(cands) > 0 {
		c := cands[0]
		why := fmt.Sprintf("its %s names machine %s, which neither boots from %s nor listed it, and the report proves no TPM key the machine has bound", c.by, c.m.GetName(), r.boot)
		if w := r.id.mismatch(c.m); w != "" {
			why = fmt.Sprintf("its %s names machine %s, but %s", c.by, c.m.GetName(), w)
		}
		return r.park(ctx, tx, nil, absorb, c.m, why)
	}
	if owner, err := r.bmcOwner(ctx, tx); err != nil {
		return err
	} else if owner != nil {
		return r.park(ctx, tx, nil, absorb, owner, fmt.Sprintf("the report states BMC address %s, enrolled for machine %s; a BMC address alone identifies no machine", r.bmcHost, owner.GetName()))
	}
	if err := r.reserve(ctx); err != nil {
		return err
	}
	if absorb != nil {
		return r.land(ctx, tx, absorb, "new", absorb, nil)
	}
	m := &inventoryv1.Machine{Name: MachineNameForMAC(r.boot), CreatedAt: r.now, BootIntent: inventoryv1.BootIntent_BOOT_INTENT_DISCOVER}
	if err := Transition(m, EventCreated); err != nil {
		return err
	}
	return r.land(ctx, tx, m, "new", nil, nil)
}

// candidate is a machine the report's identity names.
type candidate struct {
	m  *inventoryv1.Machine
	by string
}

// candidates are the machines the report's TPM key, serial and UUID index
// records name (each once, in that order), and the record named after the
// boot MAC when it is not the placeholder being absorbed.
func (r *registration) candidates(ctx context.Context, tx *record.Tx, absorb *inventoryv1.Machine) ([]candidate, error) {
	var out []candidate
	seen := map[string]bool{}
	add := func(m *inventoryv1.Machine, by string) {
		if m != nil && !seen[m.GetName()] && (absorb == nil || m.GetName() != absorb.GetName()) {
			seen[m.GetName()] = true
			out = append(out, candidate{m, by})
		}
	}
	for _, ix := range r.indexes() {
		m, err := txIndexed(ctx, tx, ix.key, ix.agrees)
		if err != nil {
			return nil, err
		}
		add(m, ix.by)
	}
	named, err := txMachine(ctx, tx, MachineNameForMAC(r.boot))
	if err != nil {
		return nil, err
	}
	add(named, "name")
	return out, nil
}

// indexRef is one identity index record of a report.
type indexRef struct {
	key, by, value string
	agrees         func(*inventoryv1.Machine) bool
}

func (r *registration) indexes() []indexRef {
	var out []indexRef
	if ek := r.id.ek; ek != "" {
		out = append(out, indexRef{ekPrefix + ek, "TPM key", shortEK(ek), func(m *inventoryv1.Machine) bool { return m.GetEkIdentity() == ek }})
	}
	if s := r.id.serial; s != "" {
		out = append(out, indexRef{serialPrefix + url.PathEscape(s), "serial", fmt.Sprintf("%q", s), hasSerial(s)})
	}
	if u := r.id.uuid; u != "" {
		out = append(out, indexRef{uuidPrefix + u, "uuid", u, hasUUID(u)})
	}
	return out
}

// bmcOwner is the machine whose enrolled BMC address the report states,
// if any agrees with its index record.
func (r *registration) bmcOwner(ctx context.Context, tx *record.Tx) (*inventoryv1.Machine, error) {
	if r.bmcHost == "" {
		return nil, nil
	}
	for _, port := range []uint32{623, 443} {
		var b inventoryv1.BmcAddressBinding
		ok, err := tx.Get(ctx, BMCAddressKey(r.bmcHost, port), &b)
		if err != nil || !ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		m, err := txMachine(ctx, tx, b.GetMachineName())
		if err != nil {
			return nil, err
		}
		if m != nil && m.GetBmc().GetAddress() == r.bmcHost {
			return m, nil
		}
	}
	return nil, nil
}

// land applies the report to m (its record as read; holder: m already
// holds the boot MAC; absorb: a placeholder holding it, deleted).
func (r *registration) land(ctx context.Context, tx *record.Tx, m *inventoryv1.Machine, by string, holder, absorb *inventoryv1.Machine) error {
	name := m.GetName()
	mt := Match{Name: name, Machine: m, By: by, Holder: holder, Identified: true}
	if absorb != nil {
		mt.Holder = absorb
	}
	if by == "new" && holder == nil {
		mt.Machine = nil // not stored yet
	}
	if r.opts.Admit != nil {
		if err := r.opts.Admit(mt); err != nil {
			return err
		}
	}
	m = proto.CloneOf(m)
	if absorb != nil {
		if err := tx.Delete(machinePrefix + absorb.GetName()); err != nil {
			return err
		}
		r.absorbed = absorb.GetName()
		r.written = append(r.written, written{absorb.GetName(), nil})
	} else if holder != nil && placeholder(holder) {
		r.absorbed = holder.GetName()
	}
	if !hasMAC(m, r.boot) || holder == nil {
		if err := tx.Put(macPrefix+r.boot, &inventoryv1.MacBinding{MachineName: name}); err != nil {
			return err
		}
	}
	flags, err := r.index(ctx, tx, name)
	if err != nil {
		return err
	}
	changes := diffFacts(m.GetFacts(), r.facts, r.now)
	r.changes = len(changes)
	m.FactHistory = r.i.trimHistory(append(m.FactHistory, changes...))
	m.Facts = r.facts
	r.id.apply(m)
	if !slices.Contains(m.Macs, r.boot) {
		m.Macs = append(m.Macs, r.boot)
	}
	m.BootMac = r.boot
	m.Flags = mergeFlags(m.GetFlags(), flags)
	// The discovery agent came up: whatever powered the machine on booted
	// it — unless its install is done: then it is the agent that
	// installed, registering again because its session broke before the
	// reboot or kexec into the hypervisor image, and the watchdog keeps
	// waiting for the node (lifecycle/kexec.go).
	if m.GetState() != inventoryv1.Machine_INSTALLING || !m.GetInstall().GetDone() {
		m.Watchdog = nil
	}
	from := m.GetState()
	if err := Transition(m, EventRegistered); err != nil {
		return err
	}
	became := m.GetState() != from
	if became {
		m.StateReason = ""
		if m.GetBootIntent() == inventoryv1.BootIntent_BOOT_INTENT_DISCOVER || m.GetBootIntent() == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED {
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
		}
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[AnnotationLastSeen] = r.now.AsTime().UTC().Format("2006-01-02T15:04:05Z")
	if r.bmcHost != "" {
		r.bmcFilled, r.bmcMismatch = applyInbandBMC(m, r.bmcHost)
	}
	if r.i.cfg.LLDPLabels {
		applyLLDPLabels(m, r.boot) // lldp.go
	}
	if r.opts.Hook != nil {
		r.opts.Hook(m, became)
	}
	m.Name = name
	m.UpdatedAt = r.now
	if err := tx.Put(machinePrefix+name, m); err != nil {
		return err
	}
	r.out, r.by = m, by
	r.written = append(r.written, written{name, m})
	return nil
}

// index points the report's identity index records at machine name in
// tx, unless another machine that holds the same identifier has them:
// then both are flagged (the flags for name are returned, the other
// machine's are written in tx).
func (r *registration) index(ctx context.Context, tx *record.Tx, name string) ([]string, error) {
	var flags []string
	for _, ix := range r.indexes() {
		var b inventoryv1.MacBinding
		exists, err := tx.Get(ctx, ix.key, &b)
		if err != nil {
			return nil, err
		}
		if exists && b.GetMachineName() == name {
			continue
		}
		if exists {
			other, err := txMachine(ctx, tx, b.GetMachineName())
			if err != nil {
				return nil, err
			}
			if other != nil && ix.agrees(other) {
				flags = append(flags, fmt.Sprintf("%s: %s %s is also held by machine %s", FlagDuplicateSerial, ix.by, ix.value, other.GetName()))
				other = proto.CloneOf(other)
				other.Flags = mergeFlags(other.GetFlags(), []string{fmt.Sprintf("%s: %s %s is also held by machine %s", FlagDuplicateSerial, ix.by, ix.value, name)})
				if err := tx.Put(machinePrefix+other.GetName(), other); err != nil {
					return nil, err
				}
				r.written = append(r.written, written{other.GetName(), other})
				continue
			}
		}
		if err := tx.Put(ix.key, &inventoryv1.MacBinding{MachineName: name}); err != nil {
			return nil, err
		}
	}
	return flags, nil
}

// park records the report on its own record in CONFLICT: prev is that
// record when the boot MAC is bound to it already; absorb, a placeholder
// holding the boot MAC, is replaced by it; claimed is the machine the
// report claimed to be (nil when it is gone).
func (r *registration) park(ctx context.Context, tx *record.Tx, prev, absorb, claimed *inventoryv1.Machine, why string) error {
	name := ConflictName(r.boot)
	p := prev
	if p == nil {
		var err error
		if p, err = txMachine(ctx, tx, name); err != nil {
			return err
		}
	}
	if p == nil {
		if err := r.reserve(ctx); err != nil {
			return err
		}
		p = &inventoryv1.Machine{Name: name, CreatedAt: r.now, BootIntent: inventoryv1.BootIntent_BOOT_INTENT_LOCAL}
	} else {
		p = proto.CloneOf(p)
	}
	if err := Transition(p, EventParked); err != nil {
		return err
	}
	if absorb != nil {
		if err := tx.Delete(machinePrefix + absorb.GetName()); err != nil {
			return err
		}
		r.written = append(r.written, written{absorb.GetName(), nil})
	}
	// The boot MAC is the parked record's when nobody else's: it stays
	// the real holder's otherwise (its script does not change).
	bound := absorb != nil || (prev != nil && hasMAC(prev, r.boot))
	if absorb == nil && prev == nil {
		var b inventoryv1.MacBinding
		exists, err := tx.Get(ctx, macPrefix+r.boot, &b)
		if err != nil {
			return err
		}
		bound = !exists
	}
	if bound {
		if err := tx.Put(macPrefix+r.boot, &inventoryv1.MacBinding{MachineName: name}); err != nil {
			return err
		}
		p.BootMac, p.Macs = r.boot, []string{r.boot}
	}
	changes := diffFacts(p.GetFacts(), r.facts, r.now)
	p.FactHistory = r.i.trimHistory(append(p.FactHistory, changes...))
	p.Facts = r.facts
	p.Serial, p.SystemUuid, p.BaseboardSerial, p.EkIdentity = r.id.serial, r.id.uuid, r.id.board, r.id.ek
	c := p.GetConflict()
	p.Conflict = &inventoryv1.Conflict{BootMac: r.boot, Reason: why, At: r.now, Reports: c.GetReports() + 1}
	if claimed != nil {
		p.Conflict.Machine = claimed.GetName()
	}
	p.StateReason = "parked: " + why
	p.UpdatedAt = r.now
	if err := tx.Put(machinePrefix+name, p); err != nil {
		return err
	}
	r.parked, r.claimed = p, claimed
	r.written = append(r.written, written{name, p})
	return nil
}

// parkedEvents puts a parked report on the timelines of its boot MAC and
// of the machine it claimed, and returns ErrParked with the reason.
func (i *Inventory) parkedEvents(r *registration) error {
	p, c := r.parked, r.parked.GetConflict()
	attrs := map[string]string{"boot_mac": r.boot, "serial": r.id.serial, "uuid": r.id.uuid, "parked_as": p.GetName(), "claimed": c.GetMachine()}
	detail := fmt.Sprintf("report from %s (%s) parked as %s: %s", r.boot, r.id.describe(), p.GetName(), c.GetReason())
	i.Event(r.boot, "inventory", "register-conflict", detail, attrs)
	if mac := firstMAC(r.claimed); r.claimed != nil && mac != "" && mac != r.boot {
		i.Event(mac, "inventory", "register-conflict", detail, attrs)
	}
	if n, ok := i.refusals.Allow(); ok {
		i.log.Warn("discovery report parked in CONFLICT", "parked_as", p.GetName(), "mac", r.boot, "claimed", c.GetMachine(), "serial", r.id.serial, "reason", c.GetReason(), "suppressed", n)
	}
	return fmt.Errorf("%w: the report from %s is parked as machine %s: %s; an operator must adopt it (corral machine adopt %s) or reject it (corral machine reject %s)",
		ErrParked, r.boot, p.GetName(), c.GetReason(), p.GetName(), p.GetName())
}

// txMachine reads machine name in tx (nil when absent).
func txMachine(ctx context.Context, tx *record.Tx, name string) (*inventoryv1.Machine, error) {
	if !validName(name) {
		return nil, nil // no record can have it
	}
	m := newMachine()
	ok, err := tx.Get(ctx, machinePrefix+name, m)
	if err != nil || !ok {
		return nil, err
	}
	return m, nil
}

// txMachineByMAC reads the machine mac is bound to in tx (nil when none,
// or when the binding names a machine that is gone or does not list mac).
func txMachineByMAC(ctx context.Context, tx *record.Tx, mac string) (*inventoryv1.Machine, error) {
	return txIndexed(ctx, tx, macPrefix+mac, func(m *inventoryv1.Machine) bool { return hasMAC(m, mac) })
}

// txIndexed reads the machine an index record names in tx, if it agrees.
func txIndexed(ctx context.Context, tx *record.Tx, key string, agrees func(*inventoryv1.Machine) bool) (*inventoryv1.Machine, error) {
	var b inventoryv1.MacBinding
	ok, err := tx.Get(ctx, key, &b)
	if err != nil || !ok {
		return nil, err
	}
	m, err := txMachine(ctx, tx, b.GetMachineName())
	if err != nil || m == nil || !agrees(m) {
		return nil, err
	}
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
	// EKIdentity is the TPM endorsement key the caller verified the
	// machine holds (credential activation), "" without a TPM proof. It
	// must never come from the report itself.
	EKIdentity string
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

// firstMAC is the MAC a machine is best known by (its boot MAC).
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

// hasSerial and hasUUID say whether a machine agrees with a serial or
// UUID index record: it has that serial or UUID recorded.
func hasSerial(serial string) func(*inventoryv1.Machine) bool {
	return func(m *inventoryv1.Machine) bool { return m.GetSerial() == serial }
}

func hasUUID(uuid string) func(*inventoryv1.Machine) bool {
	return func(m *inventoryv1.Machine) bool { return normUUID(m.GetSystemUuid()) == uuid }
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
