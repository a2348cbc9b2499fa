package coldplug

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"
)

// job is one module to load for a modalias; seq orders results, gen is
// its generation (1: a device coldplug found at start; n+1: a device
// that appeared after a generation-n module loaded).
type job struct {
	mod, alias string
	seq, gen   int
}

type loadDone struct {
	job
	err  error
	took time.Duration
}

type eventItem struct {
	ev  Uevent
	err error
}

// pipeline loads modules as udev does: each module starts as soon as a
// device needing it is known (from the first scan or a uevent), not when
// a whole round has finished, so a slow driver (a BMC interface waiting
// for its controller) does not hold up the children of a fast one (the
// virtio NIC and disks behind virtio_pci). It returns once nothing is
// loading and Settle has passed since the last module loaded without a
// new device (each device added meanwhile extends it, up to 4×Settle).
func pipeline(ctx context.Context, cfg Config, log *slog.Logger, events Events, aliases Aliases,
	seen map[string]bool, scan func() ([]string, error), fresh []string, res *Result) error {
	// The reader owns the socket until Close (deferred by Run) ends it.
	evc := make(chan eventItem, 64)
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			ev, err := events.Next(time.Now().Add(100 * time.Millisecond))
			if errors.Is(err, ErrNoEvent) {
				select {
				case <-stop:
					return
				default:
					continue
				}
			}
			select {
			case evc <- eventItem{ev, err}:
			case <-stop:
				return
			}
			if err != nil && !errors.Is(err, ErrOverflow) {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		events.Close() // ends a read in progress; Run's Close is then a no-op
		<-readerDone
	}()

	tried := map[string]bool{}
	var pending []job
	seq, maxGen := 0, 0
	enqueue := func(modaliases []string, gen int) {
		for _, m := range modaliases {
			for _, mod := range aliases.Match(m) {
				if tried[mod] {
					continue
				}
				tried[mod] = true
				if hold(cfg, log, res, mod, m) {
					continue
				}
				if gen > cfg.MaxRounds {
					log.Warn("module not loaded: too many generations of devices", "module", mod, "modalias", m)
					continue
				}
				seq++
				pending = append(pending, job{mod: mod, alias: m, seq: seq, gen: gen})
			}
		}
	}
	enqueue(fresh, 1)

	results := make(chan loadDone)
	inflight := 0
	startLoads := func() {
		for inflight < cfg.Parallel && len(pending) > 0 {
			j := pending[0]
			pending = pending[1:]
			inflight++
			res.Rounds = max(res.Rounds, j.gen)
			go func() {
				t := time.Now()
				err := cfg.Loader.Load(j.mod)
				results <- loadDone{j, err, time.Since(t)}
			}()
		}
	}
	var loaded []loadDone
	defer func() {
		// Results in discovery order, as the rounds recorded them.
		sort.Slice(loaded, func(a, b int) bool { return loaded[a].seq < loaded[b].seq })
		for _, d := range loaded {
			res.Loaded = append(res.Loaded, d.mod)
		}
	}()
	// drain waits for loads still running when Run must return.
	drain := func() {
		for ; inflight > 0; inflight-- {
			<-results
		}
	}

	startLoads()
	var quiet, limit time.Time // zero: nothing loaded yet, nothing to wait for
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		if inflight == 0 && len(pending) == 0 && !now.Before(quiet) {
			return nil
		}
		if inflight == 0 && len(pending) == 0 {
			timer.Reset(quiet.Sub(now))
		}
		select {
		case d := <-results:
			inflight--
			if d.err != nil {
				res.Failed[d.mod] = d.err.Error()
				log.Warn("module load failed", "module", d.mod, "modalias", d.alias, "took_ms", ms(d.took), "err", d.err)
			} else {
				loaded = append(loaded, d)
				maxGen = max(maxGen, d.gen)
				log.Info("module loaded", "module", d.mod, "modalias", d.alias, "took_ms", ms(d.took), "generation", d.gen)
				// Its devices' children are announced by now; wait
				// Settle for those of asynchronous probes.
				now := time.Now()
				if q := now.Add(cfg.Settle); q.After(quiet) {
					quiet = q
				}
				limit = now.Add(4 * cfg.Settle)
			}
			cfg.Watch.Signal()
			startLoads()
		case it := <-evc:
			switch {
			case errors.Is(it.err, ErrOverflow):
				more, err := scan()
				if err != nil {
					drain()
					return err
				}
				log.Warn("uevents lost: sysfs walked", "new_modaliases", len(more))
				enqueue(more, maxGen+1)
			case it.err != nil:
				// No more events: what the sysfs walk finds now is
				// loaded, and coldplug ends when that is done.
				log.Warn("uevents failed: walking sysfs once more", "err", it.err)
				more, err := scan()
				if err != nil {
					drain()
					return err
				}
				enqueue(more, maxGen+1)
				evc = nil
			case it.ev.Action != "add":
			case it.ev.Modalias != "" && !seen[it.ev.Modalias]:
				seen[it.ev.Modalias] = true
				enqueue([]string{it.ev.Modalias}, maxGen+1)
			case !quiet.IsZero():
				// A device without a modalias (a disk, a queue): a probe
				// is still going on; its children may follow.
				if q := time.Now().Add(cfg.Settle); q.After(quiet) {
					quiet = q
					if quiet.After(limit) {
						quiet = limit
					}
				}
			}
			startLoads()
		case <-timer.C:
		case <-ctx.Done():
			drain()
			return fmt.Errorf("coldplug: %w", ctx.Err())
		}
	}
}
