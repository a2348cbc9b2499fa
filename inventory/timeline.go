package inventory

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	boottimeline "github.com/corralhq/corral/inventory/timeline"
)

// Timeline limits' defaults (Config fields in machines.go): package
// timeline's.
const (
	DefaultTimelineLimit       = boottimeline.DefaultLimit
	DefaultTimelineMaxEntries  = boottimeline.DefaultMaxEntries
	DefaultTimelineQueue       = boottimeline.DefaultQueue
	DefaultTimelineDetailBytes = boottimeline.DefaultDetailBytes
	DefaultTimelineAttrs       = boottimeline.DefaultAttrs
	DefaultTimelineAttrBytes   = boottimeline.DefaultAttrBytes
)

// TimelineBootLAN bounds the boot timeline's entries of the boot LAN's
// unauthenticated requests (DHCP, TFTP, boot HTTP, router solicitations):
// their own per-MAC cap and rates per MAC and per source address
// (package timeline's BootLAN; zero fields take its defaults).
type TimelineBootLAN = boottimeline.BootLAN

// timeline is the boot timeline an Inventory keeps (package timeline):
// Register and the BMC record to it, and Run runs it.
type timeline struct{ *boottimeline.Timeline }

// newTimeline makes inv's timeline from inv.cfg.
func newTimeline(inv *Inventory) *timeline {
	c := inv.cfg
	t, err := boottimeline.New(boottimeline.Config{Store: c.Store, Logger: inv.log, Now: c.Now, Limit: c.TimelineLimit,
		Queue: c.TimelineQueue, MaxEntries: c.TimelineMaxEntries, DetailBytes: c.TimelineDetailBytes,
		Attrs: c.TimelineAttrs, AttrBytes: c.TimelineAttrBytes, BootLAN: c.TimelineBootLAN})
	if err != nil {
		panic(err) // unreachable: New refused a nil Store, the one error
	}
	return &timeline{t}
}

func (t *timeline) run(ctx context.Context) error { return t.Run(ctx) }

// Record appends an entry to a MAC's boot timeline (timeline.Timeline's
// Record): it never blocks, and drops the entry when the queue is full.
func (i *Inventory) Record(e *inventoryv1.TimelineEntry) { i.tl.Record(e) }

// Event is a convenience for Record.
func (i *Inventory) Event(mac, source, event, detail string, attrs map[string]string) {
	i.tl.Event(mac, source, event, detail, attrs)
}

// TimelineDropped is how many timeline entries were dropped, ever: on a
// full queue, and the boot LAN's over their per-MAC and per-source rates.
func (i *Inventory) TimelineDropped() (queueFull, byMAC, bySource uint64) {
	byMAC, bySource = i.tl.Limited()
	return i.tl.Dropped(), byMAC, bySource
}

// FlushTimeline waits until every entry recorded before the call is
// written (or ctx ends). Run must be running.
func (i *Inventory) FlushTimeline(ctx context.Context) error { return i.tl.Flush(ctx) }

// Timeline returns the newest limit entries (oldest first) for a MAC, or
// for every MAC of a named machine. limit <= 0 means 200.
func (i *Inventory) Timeline(ctx context.Context, name, mac string, limit int) ([]*inventoryv1.TimelineEntry, error) {
	var macs []string
	switch {
	case mac != "":
		m, err := NormalizeMAC(mac)
		if err != nil {
			return nil, err
		}
		macs = []string{m}
	case name != "":
		m, err := i.GetMachine(ctx, name)
		if err != nil {
			return nil, err
		}
		macs = m.GetMacs()
	default:
		return nil, apierr.Invalidf("timeline: a machine name or a MAC is required")
	}
	return i.tl.Entries(ctx, macs, limit)
}
