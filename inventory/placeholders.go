package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Placeholders are the machines network-boot discovery records for MACs
// it has never seen (EnsureMachineForMAC): DISCOVERED, with no serial,
// system UUID, facts, BMC or labels. Anyone on the boot LAN can make one
// per spoofed MAC, so they are capped (Config.MaxDiscovered) and the
// stale ones are collected (CollectPlaceholders).
//
// The count is kept in memory: one scan of the machines the first time a
// placeholder is to be created, then every machine write of this package
// (CreateMachine, the update path, DeleteMachine, CollectPlaceholders —
// the only writers of machine records) re-classifies the record it wrote.
// A sweep of CollectPlaceholders also drops names that are no longer
// placeholders, should two concurrent writes of one record have been
// classified out of order.

// DefaultMaxDiscovered is Config.MaxDiscovered's default: sized for a large
// datacenter's worth of machines waiting to be accepted.
const DefaultMaxDiscovered = 10000

// DefaultDiscoveredGCAfter is how old a placeholder with no boot activity
// gets before CollectPlaceholders deletes it (corrald's
// --discovered-gc-after default).
const DefaultDiscoveredGCAfter = 24 * time.Hour

// ErrDiscoveredCap is returned by EnsureMachineForMAC when the number of
// placeholders has reached Config.MaxDiscovered (class apierr.ErrExhausted).
var ErrDiscoveredCap = apierr.New(apierr.ErrExhausted, "inventory: too many discovered machines")

// capLogInterval is the least time between two "cap reached" log lines.
const capLogInterval = time.Minute

// isPlaceholder reports whether m counts against Config.MaxDiscovered: a
// record discovery made and nothing else has claimed yet.
func isPlaceholder(m *inventoryv1.Machine) bool {
	return m.GetState() == inventoryv1.Machine_DISCOVERED && m.GetSerial() == "" && m.GetSystemUuid() == "" &&
		m.GetFacts() == nil && m.GetBmc() == nil && len(m.GetLabels()) == 0
}

// collectable reports whether a placeholder may be deleted for being
// stale: nothing but discovery ever touched it (no annotations, flags,
// install, wipe, node, watchdog, fact history, boot intent other than
// discover).
func collectable(m *inventoryv1.Machine) bool {
	intent := m.GetBootIntent()
	return isPlaceholder(m) && len(m.GetAnnotations()) == 0 && len(m.GetFlags()) == 0 && m.GetInstall() == nil &&
		m.GetWipe() == nil && m.GetNodeName() == "" && m.GetWatchdog() == nil && len(m.GetFactHistory()) == 0 &&
		(intent == inventoryv1.BootIntent_BOOT_INTENT_DISCOVER || intent == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED)
}

// placeholders counts placeholder machines. Its map holds one entry per
// placeholder in the store: bounded by the cap for the ones discovery
// makes.
type placeholders struct {
	max int // < 0: no cap
	mu  sync.Mutex
	// loaded says names reflects the store (after the first scan).
	loaded bool
	// names are the placeholders; the value is the epoch they were added
	// in, so a sweep only drops names it has seen the record of.
	names   map[string]uint64
	epoch   uint64
	pending int // creations reserved and not finished

	refused     int // refusals since the last log line
	lastCapWarn time.Time

	// The machines registered and not accepted (unaccepted): counted
	// like the placeholders, capped at umax (< 0: no cap).
	umax       int
	unaccepted map[string]bool
	upending   int
	urefused   int
	lastUWarn  time.Time
}

// isUnaccepted reports whether m counts against Config.MaxUnaccepted: a
// report made it (INVENTORIED, or parked in CONFLICT) and no operator or
// policy has accepted it.
func isUnaccepted(m *inventoryv1.Machine) bool {
	return m.GetState() == inventoryv1.Machine_INVENTORIED || m.GetState() == inventoryv1.Machine_CONFLICT
}

// ErrUnacceptedCap is returned by Register for a report that would make a
// new machine when Config.MaxUnaccepted machines already wait to be
// accepted (class apierr.ErrExhausted).
var ErrUnacceptedCap = apierr.New(apierr.ErrExhausted, "inventory: too many machines wait to be accepted")

// reserveUnaccepted takes one slot for a machine a report is about to
// make, or fails with ErrUnacceptedCap; release must be called once the
// report is written (observe counts the record).
func (i *Inventory) reserveUnaccepted(ctx context.Context, mac string) (release func(), err error) {
	p := &i.ph
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded {
		if err := p.load(ctx, i); err != nil {
			return nil, fmt.Errorf("inventory: count machines: %w", err)
		}
	}
	if p.umax >= 0 && len(p.unaccepted)+p.upending >= p.umax {
		p.urefused++
		if i.cfg.ReportRefused != nil {
			i.cfg.ReportRefused(RefusedUnacceptedCap)
		}
		now := i.cfg.Now()
		if p.lastUWarn.IsZero() || now.Sub(p.lastUWarn) >= capLogInterval {
			i.log.Warn("unaccepted-machine cap reached: reports of new machines are refused", "mac", mac,
				"unaccepted", len(p.unaccepted), "max_unaccepted", p.umax, "refused", p.urefused)
			p.lastUWarn, p.urefused = now, 0
		}
		return nil, fmt.Errorf("%w: %d machines are registered and not accepted (the limit, --max-unaccepted); the report from %s is not recorded: accept or delete machines first",
			ErrUnacceptedCap, len(p.unaccepted), mac)
	}
	p.upending++
	return func() {
		p.mu.Lock()
		p.upending--
		p.mu.Unlock()
	}, nil
}

// UnacceptedCount returns how many machines count against the unaccepted
// cap (after the first scan; before it, -1).
func (i *Inventory) UnacceptedCount() int {
	i.ph.mu.Lock()
	defer i.ph.mu.Unlock()
	if !i.ph.loaded {
		return -1
	}
	return len(i.ph.unaccepted)
}

// load scans the machines once (caller holds mu).
func (p *placeholders) load(ctx context.Context, i *Inventory) error {
	p.epoch++
	names, unaccepted := make(map[string]uint64), make(map[string]bool)
	// Summaries, a bounded batch at a time: the classification reads
	// neither the facts' detail nor the fact history.
	err := i.EachMachine(ctx, &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, func(m *inventoryv1.Machine) error {
		if isPlaceholder(m) {
			names[m.GetName()] = p.epoch
		}
		if isUnaccepted(m) {
			unaccepted[m.GetName()] = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.names, p.unaccepted, p.loaded = names, unaccepted, true
	return nil
}

// reservePlaceholder takes one slot for a placeholder about to be created, or fails
// with ErrDiscoveredCap. release must be called once the create is over
// (the record, if made, is counted by observe).
func (i *Inventory) reservePlaceholder(ctx context.Context, mac string) (release func(), err error) {
	p := &i.ph
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded {
		if err := p.load(ctx, i); err != nil {
			return nil, fmt.Errorf("inventory: count discovered machines: %w", err)
		}
		i.log.Info("discovered machines counted", "placeholders", len(p.names), "max_discovered", p.max)
	}
	if p.max >= 0 && len(p.names)+p.pending >= p.max {
		p.refused++
		now := i.cfg.Now()
		if p.lastCapWarn.IsZero() || now.Sub(p.lastCapWarn) >= capLogInterval {
			i.log.Warn("discovered-machine cap reached: unknown MACs are not recorded", "mac", mac,
				"placeholders", len(p.names), "max_discovered", p.max, "refused", p.refused)
			p.lastCapWarn, p.refused = now, 0
		}
		return nil, fmt.Errorf("%w: %d unaccepted machines seen only by network boot (the limit, --max-discovered); MAC %s is not recorded",
			ErrDiscoveredCap, len(p.names), mac)
	}
	p.pending++
	return func() {
		p.mu.Lock()
		p.pending--
		p.mu.Unlock()
	}, nil
}

// observe re-classifies a machine record this package just wrote (m nil:
// deleted).
func (i *Inventory) observe(name string, m *inventoryv1.Machine) {
	p := &i.ph
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded {
		return // the first scan will see it
	}
	p.epoch++
	if m != nil && isUnaccepted(m) {
		p.unaccepted[name] = true
	} else {
		delete(p.unaccepted, name)
	}
	if m != nil && isPlaceholder(m) {
		if _, ok := p.names[name]; !ok {
			p.names[name] = p.epoch
		}
		return
	}
	delete(p.names, name)
}

// DiscoveredCount returns how many placeholders count against the cap
// (after the first scan; before it, -1).
func (i *Inventory) DiscoveredCount() int {
	i.ph.mu.Lock()
	defer i.ph.mu.Unlock()
	if !i.ph.loaded {
		return -1
	}
	return len(i.ph.names)
}

// PlaceholderSweep is what one CollectPlaceholders pass found and did.
type PlaceholderSweep struct {
	// Machines were scanned; Placeholders of them count against the cap.
	Machines, Placeholders int
	// Deleted placeholders were stale; Active ones were old but their
	// MACs had timeline entries newer than the age.
	Deleted, Active int
}

// CollectPlaceholders deletes the placeholders that nothing but discovery
// ever touched (see collectable: a machine with a BMC, labels or any state
// beyond DISCOVERED is never collected), created and last updated more
// than age ago, whose MACs have no timeline entry newer than age. Each
// deletion is a compare-and-swap that re-checks the record, then the MAC
// bindings that still name it and the timeline entries read before are
// deleted by revision; each is logged. A record that changes meanwhile is
// left alone. One pass lists the machines once and each candidate's
// timeline once. It returns the first store error after finishing what it
// could.
func (i *Inventory) CollectPlaceholders(ctx context.Context, age time.Duration) (PlaceholderSweep, error) {
	var sw PlaceholderSweep
	if age <= 0 {
		return sw, apierr.Invalidf("placeholder age %s must be positive", age)
	}
	now := i.cfg.Now()
	cutoff := now.Add(-age)
	i.ph.mu.Lock()
	startEpoch := i.ph.epoch
	i.ph.mu.Unlock()
	seen := make(map[string]bool)
	var firstErr error
	// Summaries, a bounded batch at a time; collect re-reads the whole
	// record in the transaction that deletes it.
	err := i.EachMachine(ctx, &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, func(m *inventoryv1.Machine) error {
		sw.Machines++
		if !isPlaceholder(m) {
			return nil
		}
		sw.Placeholders++
		seen[m.GetName()] = true
		if !collectable(m) || !older(m, cutoff) {
			return nil
		}
		deleted, active, err := i.collect(ctx, m, cutoff)
		switch {
		case err != nil:
			if firstErr == nil {
				firstErr = err
			}
		case active:
			sw.Active++
		case deleted:
			sw.Deleted++
			delete(seen, m.GetName())
		}
		return nil
	})
	if err != nil {
		return sw, err
	}
	// Drop names the scan saw as no (longer) placeholders, unless a write
	// since the scan began re-added them.
	i.ph.mu.Lock()
	if i.ph.loaded {
		for name, added := range i.ph.names {
			if !seen[name] && added <= startEpoch {
				delete(i.ph.names, name)
			}
		}
	}
	i.ph.mu.Unlock()
	return sw, firstErr
}

// older reports whether m was created and last updated before cutoff.
func older(m *inventoryv1.Machine, cutoff time.Time) bool {
	return m.GetCreatedAt().AsTime().Before(cutoff) && m.GetUpdatedAt().AsTime().Before(cutoff)
}

// collect deletes one stale placeholder (see CollectPlaceholders). active
// says its MACs booted recently and it was kept.
func (i *Inventory) collect(ctx context.Context, m *inventoryv1.Machine, cutoff time.Time) (deleted, active bool, err error) {
	name := m.GetName()
	macs := m.GetMacs()
	if b := m.GetBootMac(); b != "" && !slices.Contains(macs, b) {
		macs = append(macs, b)
	}
	var entries []store.KV
	var last time.Time
	for _, mac := range macs {
		kvs, err := i.cfg.Store.List(ctx, timelinePrefix+mac+"/")
		if err != nil {
			return false, false, err
		}
		for _, kv := range kvs {
			var e inventoryv1.TimelineEntry
			if err := record.Unmarshal(kv.Value, &e); err == nil && e.GetAt().AsTime().After(last) {
				last = e.GetAt().AsTime()
			}
		}
		entries = append(entries, kvs...)
	}
	if !last.Before(cutoff) {
		return false, true, nil
	}
	_, err = record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		cur, err := txMachine(ctx, tx, name)
		if err != nil {
			return err
		}
		if cur == nil || !collectable(cur) || !older(cur, cutoff) || strings.Join(cur.GetMacs(), ",") != strings.Join(m.GetMacs(), ",") {
			return errSkip
		}
		if err := tx.Delete(machinePrefix + name); err != nil {
			return err
		}
		return txUnindex(ctx, tx, cur)
	})
	if errors.Is(err, errSkip) || errors.Is(err, store.ErrNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	i.observe(name, nil)
	removed := 0
	for _, kv := range entries {
		if err := i.cfg.Store.Delete(ctx, kv.Key, kv.Revision); err == nil {
			removed++
		}
	}
	lastSeen := "never"
	if !last.IsZero() {
		lastSeen = last.UTC().Format(time.RFC3339)
	}
	i.log.Info("stale discovered machine deleted", "machine", name, "mac", strings.Join(macs, ","),
		"created", m.GetCreatedAt().AsTime().UTC().Format(time.RFC3339), "last_boot_activity", lastSeen, "timeline_entries", removed)
	return true, false, nil
}
