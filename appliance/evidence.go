package appliance

import "github.com/corralhq/corral/inventory"

// countTimeline exports to /metrics the boot timeline entries dropped: on
// a full queue, and the boot LAN's over their rates (docs/security.md,
// "Timeline classes").
func countTimeline(c counterFuncs, inv *inventory.Inventory) {
	const name = "corral_timeline_entries_dropped_total"
	const help = "Boot timeline entries not recorded, by reason: queue_full (the writers fell behind), rate_mac and rate_source (entries of unauthenticated boot requests over --timeline-boot-lan-rate-per-mac or -per-source)."
	read := func(pick func(q, m, s uint64) uint64) func() uint64 {
		return func() uint64 { return pick(inv.TimelineDropped()) }
	}
	c.CounterFunc(name, help, map[string]string{"reason": "queue_full"}, read(func(q, _, _ uint64) uint64 { return q }))
	c.CounterFunc(name, help, map[string]string{"reason": "rate_mac"}, read(func(_, m, _ uint64) uint64 { return m }))
	c.CounterFunc(name, help, map[string]string{"reason": "rate_source"}, read(func(_, _, s uint64) uint64 { return s }))
}
