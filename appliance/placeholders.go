package appliance

import (
	"context"
	"log/slog"
	"time"

	"github.com/corralhq/corral/inventory"
)

// Machines discovered by network boot (docs/architecture.md, "The walk", DHCP) are
// placeholders until they register: inventory caps how many exist
// (BootConfig.MaxDiscovered, given to inventory.New) and this component
// deletes the stale ones (BootConfig.DiscoveredGCAfter).

// maxGCInterval bounds the time between two sweeps.
const maxGCInterval = 10 * time.Minute

// gcInterval is how often the placeholder sweep runs for a given age: a
// quarter of it, at least a second, at most maxGCInterval.
func gcInterval(after time.Duration) time.Duration {
	return min(max(after/4, time.Second), maxGCInterval)
}

// initPlaceholderGC adds the component that deletes stale discovered
// placeholders (inventory.CollectPlaceholders), unless
// BootConfig.DiscoveredGCAfter is negative. It runs whether network boot
// is on or not: placeholders from an earlier run are collected too.
func (s *Server) initPlaceholderGC() {
	after := s.cfg.Boot.DiscoveredGCAfter
	if after == 0 {
		after = inventory.DefaultDiscoveredGCAfter
	}
	if after < 0 {
		s.log.Info("stale discovered machines are kept: --discovered-gc-after is negative")
		return
	}
	s.addSingleton("placeholder-gc", func(ctx context.Context) error {
		return runPlaceholderGC(ctx, s.inv, after, gcInterval(after), s.log.With("component", "placeholder-gc"))
	})
}

// collector is what the sweep needs of inventory.
type collector interface {
	CollectPlaceholders(ctx context.Context, age time.Duration) (inventory.PlaceholderSweep, error)
}

// runPlaceholderGC sweeps now and every interval until ctx ends; it
// returns nil then. A failed sweep is logged and retried at the next tick.
func runPlaceholderGC(ctx context.Context, inv collector, after, interval time.Duration, log *slog.Logger) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		sw, err := inv.CollectPlaceholders(ctx, after)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.Warn("stale discovered machines not all collected", "err", err, "deleted", sw.Deleted)
		case sw.Deleted > 0:
			log.Info("stale discovered machines collected", "deleted", sw.Deleted, "placeholders", sw.Placeholders-sw.Deleted,
				"recently_booting", sw.Active, "machines", sw.Machines, "older_than", after.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
