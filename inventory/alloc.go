package inventory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Allocation bounds.
const (
	// MaxAllocationCount is the most machines one allocation claims (one
	// store transaction holds them all; the store's limit is 128 keys).
	MaxAllocationCount = 64
	// MaxAllocationExpiry is the longest expiry an allocation may carry.
	MaxAllocationExpiry = 366 * 24 * time.Hour
	// allocateAttempts bounds how often one allocation looks for free
	// machines again after another allocation took some of those it
	// picked.
	allocateAttempts = 32
)

// Anonymous owns what is allocated on an appliance without authentication.
const Anonymous = "anonymous"

// Owner is a caller as allocation sees it (docs/security.md, "Owners").
type Owner struct {
	// ID identifies the caller: "token:<id>" for a bearer token.
	ID string
	// Name is for people: the token's description.
	Name string
	// Operator callers (OPERATOR and ADMIN) see and change every machine;
	// anyone else sees the machines nobody holds and its own, and changes
	// only its own.
	Operator bool
}

// allocHeld reports whether m is held by an allocation (not ended).
func allocHeld(m *inventoryv1.Machine) bool {
	a := m.GetAllocation()
	return a.GetOwner() != "" && a.GetReleasedAt() == nil
}

// Holds reports whether o holds m: m's current allocation is o's.
func (o Owner) Holds(m *inventoryv1.Machine) bool {
	return allocHeld(m) && m.GetAllocation().GetOwner() == o.ID
}

// Sees reports whether o may see m: an operator every machine, anyone else
// every machine that nobody else holds.
func (o Owner) Sees(m *inventoryv1.Machine) bool {
	return o.Operator || !allocHeld(m) || o.Holds(m)
}

// AllocateRequest is what AllocateMachines claims.
type AllocateRequest struct {
	// Selector is comma-separated selectors (selectors.go); Pool adds
	// pool=Pool.
	Selector, Pool string
	// Count is how many machines (0: 1), all or none.
	Count int
	// ExpiresIn releases them that long after the allocation (0: never).
	ExpiresIn time.Duration
}

// errPickTaken ends an allocation transaction whose picked machines are
// no longer all free: look again.
var errPickTaken = errors.New("a picked machine was taken")

// AllocateMachines claims Count READY machines matching the request's
// selector for owner, all or none, in one store transaction that checks
// each is still READY and still matches: of concurrent allocations for the
// same machines, each machine goes to exactly one. Bad input is
// apierr.ErrInvalid; too few free matching machines apierr.ErrExhausted
// with the numbers.
func (i *Inventory) AllocateMachines(ctx context.Context, owner Owner, req AllocateRequest) ([]*inventoryv1.Machine, error) {
	count := req.Count
	switch {
	case owner.ID == "":
		return nil, apierr.Invalidf("allocate: the caller has no identity")
	case count < 0 || count > MaxAllocationCount:
		return nil, apierr.Invalidf("count %d: allocate 1 to %d machines at a time", count, MaxAllocationCount)
	case req.ExpiresIn < 0:
		return nil, apierr.Invalidf("expiry %s is in the past: give a positive duration such as 8h", req.ExpiresIn)
	case req.ExpiresIn > MaxAllocationExpiry:
		return nil, apierr.Invalidf("expiry %s is longer than the longest allowed, %s", req.ExpiresIn, MaxAllocationExpiry)
	case req.ExpiresIn > 0 && req.ExpiresIn < time.Second:
		return nil, apierr.Invalidf("expiry %s is shorter than a second", req.ExpiresIn)
	}
	if count == 0 {
		count = 1
	}
	raw := []string{req.Selector}
	if req.Selector == "" {
		raw = nil
	}
	if req.Pool != "" {
		if err := checkLabelValue(PoolKey, req.Pool); err != nil {
			return nil, err
		}
		raw = append(raw, PoolKey+"="+req.Pool)
	}
	sels, err := ParseSelectors(raw)
	if err != nil {
		return nil, err
	}
	want := strings.Join(raw, ",")
	for attempt := 0; attempt < allocateAttempts; attempt++ {
		var free []string
		err := i.EachMachine(ctx, &inventoryv1.ListMachinesRequest{State: inventoryv1.Machine_READY, Selectors: raw, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY},
			func(m *inventoryv1.Machine) error {
				if CommissionHold(m) == nil { // commission.go
					free = append(free, m.GetName())
				}
				return nil
			})
		if err != nil {
			return nil, err
		}
		if len(free) < count {
			return nil, i.tooFew(ctx, want, count, len(free))
		}
		// Concurrent allocations pick different machines as far as they can.
		rand.Shuffle(len(free), func(a, b int) { free[a], free[b] = free[b], free[a] })
		i.warmFirst(free)
		picked := free[:count]
		now := i.cfg.Now()
		out, err := i.claim(ctx, owner, picked, sels, want, now, req.ExpiresIn)
		if errors.Is(err, errPickTaken) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, m := range out {
			i.observe(m.GetName(), m)
			detail := fmt.Sprintf("allocated to %s", ownerWords(m.GetAllocation()))
			if e := m.GetAllocation().GetExpiresAt(); e != nil {
				detail += " until " + e.AsTime().UTC().Format(time.RFC3339)
			}
			i.machineEvent(m, "allocated", detail, map[string]string{"owner": owner.ID, "allocation_id": m.GetAllocation().GetAllocationId()})
		}
		i.log.Info("machines allocated", "owner", owner.ID, "machines", names(out), "selector", want)
		return out, nil
	}
	return nil, apierr.Unavailablef("allocate %q: the free machines kept being taken by other allocations (%d tries): try again", want, allocateAttempts)
}

// warmScan bounds how many candidates an allocation asks Config.Warm
// about.
const warmScan = 256

// warmFirst moves the warm machines among the first warmScan of free
// (shuffled) to its front, keeping their order.
func (i *Inventory) warmFirst(free []string) {
	if i.cfg.Warm == nil {
		return
	}
	head := free[:min(len(free), warmScan)]
	warm := make(map[string]bool, len(head))
	for _, name := range head {
		warm[name] = i.cfg.Warm(name)
	}
	slices.SortStableFunc(head, func(a, b string) int {
		switch {
		case warm[a] == warm[b]:
			return 0
		case warm[a]:
			return -1
		}
		return 1
	})
}

// claim allocates the picked machines to owner in one transaction, or
// fails with errPickTaken when one is no longer READY or no longer
// matches.
func (i *Inventory) claim(ctx context.Context, owner Owner, picked []string, sels Selectors, want string, now time.Time, expires time.Duration) ([]*inventoryv1.Machine, error) {
	id := newAllocationID()
	var out []*inventoryv1.Machine
	_, err := record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		out = out[:0]
		for _, name := range picked {
			m, err := txMachine(ctx, tx, name)
			if err != nil {
				return err
			}
			if m == nil || m.GetState() != inventoryv1.Machine_READY || !sels.Match(m) || CommissionHold(m) != nil {
				return errPickTaken
			}
			if err := Transition(m, EventAllocated); err != nil {
				return errPickTaken
			}
			a := &inventoryv1.Allocation{Owner: owner.ID, OwnerName: owner.Name, AllocationId: id,
				AllocatedAt: timestamppb.New(now), Selector: want}
			if expires > 0 {
				a.ExpiresAt = timestamppb.New(now.Add(expires))
			}
			m.Allocation = a
			m.StateReason = ""
			m.UpdatedAt = timestamppb.New(now)
			if err := tx.Put(machinePrefix+name, m); err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

// tooFew is the error of an allocation that found fewer free machines than
// it asked for, with how many match in other states.
func (i *Inventory) tooFew(ctx context.Context, want string, count, free int) error {
	raw := []string{want}
	if want == "" {
		raw = nil
	}
	byState := map[inventoryv1.Machine_MachineState]int{}
	_ = i.EachMachine(ctx, &inventoryv1.ListMachinesRequest{Selectors: raw, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY},
		func(m *inventoryv1.Machine) error {
			if m.GetState() != inventoryv1.Machine_READY {
				byState[m.GetState()]++
			}
			return nil
		})
	var others []string
	for st, n := range byState {
		others = append(others, fmt.Sprintf("%d %s", n, st))
	}
	slices.Sort(others)
	what := fmt.Sprintf("selector %q", want)
	if want == "" {
		what = "any selector"
	}
	msg := fmt.Sprintf("no allocation: %d READY machine(s) match %s, %d wanted", free, what, count)
	if len(others) > 0 {
		msg += "; not free: " + strings.Join(others, ", ")
	}
	return apierr.Exhaustedf("%s", msg)
}

// ReleaseOptions qualify a release.
type ReleaseOptions struct {
	// Reason is recorded with the release (default: who released it).
	Reason string
	// AllocationID, when set, releases only that allocation (the expiry
	// sweep: an allocation made since is left alone).
	AllocationID string
	// Expired marks the release as the expiry's.
	Expired bool
	// Erase is how the machine's disks are erased before it is free
	// again: ERASE_LEVEL_DEFAULT takes its pool's level (Pools), none
	// without one.
	Erase inventoryv1.EraseLevel
	// Pools says a standby pool's erase level; nil: no pool erases.
	Pools ErasePolicy
}

// ErasePolicy says what a release erases by default: the erase level of
// the standby pool named pool (ERASE_LEVEL_NONE, or DEFAULT, for none).
// It is called inside a release's compare-and-swap mutation, so it must
// not block for long.
type ErasePolicy interface {
	EraseLevel(pool string) inventoryv1.EraseLevel
}

// EraseIDPrefix starts every erase id, so the agent's progress of an
// erase is told from an install's by its id alone.
const EraseIDPrefix = "erase-"

// CheckEraseLevel refuses an erase level the API does not define.
func CheckEraseLevel(l inventoryv1.EraseLevel) error {
	if _, ok := inventoryv1.EraseLevel_name[int32(l)]; !ok {
		return apierr.Invalidf("erase level %d: want none, quick, full or secure", int32(l))
	}
	return nil
}

// EraseWords names an erase level for people: "full".
func EraseWords(l inventoryv1.EraseLevel) string {
	return strings.ToLower(strings.TrimPrefix(l.String(), "ERASE_LEVEL_"))
}

// eraseLevel resolves opts.Erase for m: DEFAULT is m's pool's level.
func eraseLevel(m *inventoryv1.Machine, opts ReleaseOptions) inventoryv1.EraseLevel {
	l := opts.Erase
	if l == inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT && opts.Pools != nil && m.GetPool() != "" {
		l = opts.Pools.EraseLevel(m.GetPool())
	}
	if l == inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT || CheckEraseLevel(l) != nil {
		return inventoryv1.EraseLevel_ERASE_LEVEL_NONE
	}
	return l
}

// EraseDisks are the disks a release erases: every non-removable disk in
// m's facts, as device paths.
func EraseDisks(m *inventoryv1.Machine) []string {
	var out []string
	for _, d := range m.GetFacts().GetDisks() {
		if d.GetRemovable() || d.GetName() == "" {
			continue
		}
		out = append(out, "/dev/"+strings.TrimPrefix(d.GetName(), "/dev/"))
	}
	return out
}

// eraseAgain reports whether m waits for an erase run again: its release's
// erase failed (FAILED) or has not finished (RELEASING), its allocation
// ended.
func eraseAgain(m *inventoryv1.Machine) bool {
	if allocHeld(m) || m.GetErase() == nil {
		return false
	}
	switch m.GetState() {
	case inventoryv1.Machine_RELEASING:
		return true
	case inventoryv1.Machine_FAILED:
		return m.GetErase().GetError() != ""
	default:
		return false
	}
}

// ReleaseMachine ends the allocation of machine name: by its owner or an
// operator (anyone else: apierr.ErrPermission). It keeps the ended
// allocation, with when, why and by whom, for its owner to read until it
// is allocated again, and sets boot intent discover (a deployed machine
// boots discovery again, not its disk). With an erase level
// (opts.Erase, or its pool's) the same mutation makes it RELEASING with a
// pending Erase of every non-removable disk, which the lifecycle hands
// to its discovery agent; it becomes READY once the erase succeeded.
// Without one it is READY at once. A machine not allocated is
// apierr.ErrPrecondition saying why (released already, and why), except
// that an operator may release again, with an erase level, a machine
// whose erase failed or has not finished: the erase runs again. The
// machine's deployment, if any, is left for the lifecycle to close
// (lifecycle.onReleased).
func (i *Inventory) ReleaseMachine(ctx context.Context, by Owner, name string, opts ReleaseOptions) (*inventoryv1.Machine, error) {
	if err := CheckEraseLevel(opts.Erase); err != nil {
		return nil, err
	}
	var reason string
	var again bool
	m, err := i.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		a := m.GetAllocation()
		again = false
		if !by.Operator && !by.Holds(m) {
			if a.GetOwner() == by.ID && a.GetReleasedAt() != nil {
				return apierr.Preconditionf("machine %q: your allocation ended at %s: %s", name,
					a.GetReleasedAt().AsTime().UTC().Format(time.RFC3339), a.GetReleaseReason())
			}
			return apierr.PermissionDeniedf("machine %q is not allocated to you (%s): only its owner or an operator may release it", name, by.ID)
		}
		if opts.AllocationID != "" && (a.GetAllocationId() != opts.AllocationID || !allocHeld(m)) {
			return errSkip
		}
		level := eraseLevel(m, opts)
		now := i.cfg.Now()
		if eraseAgain(m) {
			if level == inventoryv1.EraseLevel_ERASE_LEVEL_NONE {
				return apierr.Preconditionf("machine %q is %s: its erase %s; erase it again with a level (corral machine release %s --erase quick|full|secure)",
					name, m.GetState(), eraseWhy(m.GetErase()), name)
			}
			if err := Transition(m, EventReleasing); err != nil {
				return err
			}
			again = true
			reason = cmp.Or(opts.Reason, "erase again by an operator")
			m.Erase = newErase(m, level, now)
			m.StateReason = fmt.Sprintf("releasing: erasing %s (%s): %s", strings.Join(m.Erase.GetDisks(), ", "), EraseWords(level), reason)
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
			m.Watchdog = nil
			return nil
		}
		if !allocHeld(m) {
			if a.GetReleasedAt() != nil {
				return apierr.Preconditionf("machine %q is %s: its allocation ended at %s: %s", name, m.GetState(),
					a.GetReleasedAt().AsTime().UTC().Format(time.RFC3339), a.GetReleaseReason())
			}
			return apierr.Preconditionf("machine %q is %s, not allocated: nothing to release", name, m.GetState())
		}
		disks := EraseDisks(m)
		erase := level != inventoryv1.EraseLevel_ERASE_LEVEL_NONE && len(disks) > 0
		ev := EventReleased
		if erase {
			// The allocation is still open here, as the transition wants
			// of an owner's event; it ends below, in the same mutation.
			ev = EventReleasing
		}
		if err := Transition(m, ev); err != nil {
			return err
		}
		reason = opts.Reason
		switch {
		case reason != "":
		case opts.Expired:
			reason = "allocation expired at " + a.GetExpiresAt().AsTime().UTC().Format(time.RFC3339)
		case by.Holds(m):
			reason = "released by its owner"
		default:
			reason = "released by an operator"
		}
		a.ReleasedAt = timestamppb.New(now)
		a.ReleaseReason = reason
		a.ReleasedBy = by.ID
		m.StateReason = reason
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		if erase {
			m.Erase = newErase(m, level, now)
			m.StateReason = fmt.Sprintf("releasing: erasing %s (%s): %s", strings.Join(disks, ", "), EraseWords(level), reason)
			// The erase timeout bounds it from here; a boot watchdog
			// failing it would leave it FAILED without a failed erase.
			m.Watchdog = nil
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	attrs := map[string]string{"owner": m.GetAllocation().GetOwner(), "by": by.ID, "allocation_id": m.GetAllocation().GetAllocationId()}
	var erase string
	if m.GetState() == inventoryv1.Machine_RELEASING {
		e := m.GetErase()
		attrs["erase"] = EraseWords(e.GetLevel())
		attrs["install_id"] = e.GetEraseId()
		erase = fmt.Sprintf("; RELEASING: %s erase of %s", EraseWords(e.GetLevel()), strings.Join(e.GetDisks(), ", "))
	}
	if again {
		i.machineEvent(m, "releasing", fmt.Sprintf("erase again by %s: %s%s", by.ID, reason, erase), attrs)
		i.log.Info("machine erase again", "machine", name, "by", by.ID, "erase", attrs["erase"])
		return m, nil
	}
	event := "released"
	if opts.Expired {
		event = "expired"
	}
	i.machineEvent(m, event, fmt.Sprintf("allocation of %s ended: %s%s", ownerWords(m.GetAllocation()), reason, erase), attrs)
	i.log.Info("machine released", "machine", name, "owner", m.GetAllocation().GetOwner(), "by", by.ID, "reason", reason, "erase", attrs["erase"])
	return m, nil
}

// newErase is a release's pending erase of m's disks at level.
func newErase(m *inventoryv1.Machine, level inventoryv1.EraseLevel, now time.Time) *inventoryv1.Erase {
	return &inventoryv1.Erase{EraseId: EraseIDPrefix + fmt.Sprintf("%016x", rand.Uint64()), Level: level,
		Disks: EraseDisks(m), RequestedAt: timestamppb.New(now)}
}

// eraseWhy says how an erase stands, for a refusal.
func eraseWhy(e *inventoryv1.Erase) string {
	if e.GetError() != "" {
		return "failed: " + e.GetError()
	}
	return "(" + EraseWords(e.GetLevel()) + ") has not finished"
}

// IsSkip reports whether err is ReleaseMachine's answer to an
// AllocationID that is no longer the machine's: nothing was done.
func IsSkip(err error) bool { return errors.Is(err, errSkip) }

// AcceptToPool makes an INVENTORIED (or FAILED) machine READY: accepted
// for people, free to allocate (accept --target pool). Nothing is
// installed; its boot intent stays discovery.
func (i *Inventory) AcceptToPool(ctx context.Context, name string) (*inventoryv1.Machine, error) {
	m, err := i.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if err := CommissionHold(m); err != nil {
			return err
		}
		if err := Transition(m, EventPooled); err != nil {
			return err
		}
		m.StateReason = ""
		m.Install = nil
		m.NodeName = ""
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		return nil
	})
	if err != nil {
		return nil, err
	}
	detail := "accepted for allocation: READY"
	if p := m.GetPool(); p != "" {
		detail += " in pool " + p
	}
	i.machineEvent(m, "pooled", detail, nil)
	return m, nil
}

// ownerWords names an allocation's owner for people: "token:ab12 (ci)".
func ownerWords(a *inventoryv1.Allocation) string {
	if n := a.GetOwnerName(); n != "" {
		return a.GetOwner() + " (" + n + ")"
	}
	return a.GetOwner()
}

func names(ms []*inventoryv1.Machine) []string {
	out := make([]string, len(ms))
	for k, m := range ms {
		out[k] = m.GetName()
	}
	return out
}

func newAllocationID() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}
