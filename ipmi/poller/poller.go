// Package poller refreshes every enrolled machine's power state on an
// interval (default 60 s, jittered) with bounded concurrency. It knows
// nothing of inventory or BMCs: it drives a Source that cmd wires (the
// inventory's BMC control), so it imports only the standard library.
package poller

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Source lists what to poll and refreshes one item.
type Source interface {
	// PowerTargets names the machines that have a BMC.
	PowerTargets(ctx context.Context) ([]string, error)
	// RefreshPower reads one machine's power state and records it (and a
	// change in its timeline). It must honour ctx's deadline.
	RefreshPower(ctx context.Context, name string) error
}

// Config configures a Poller. Zero values take the defaults.
type Config struct {
	Source Source
	Logger *slog.Logger
	// Interval between rounds (default 60s).
	Interval time.Duration
	// Jitter is the fraction of Interval each round's start and each
	// machine's start within a round are spread by (default 0.1).
	Jitter float64
	// Concurrency bounds machines polled at once (default 16).
	Concurrency int
	// CallTimeout bounds one machine's refresh (default 15s).
	CallTimeout time.Duration
	// Filter, when set, says which of the Source's machines this poller
	// polls (in a fleet: the machines dispatched to this appliance); nil
	// polls them all. It is asked once per machine per round and must not
	// block.
	Filter func(machine string) bool
}

// Poller polls. Run it once.
type Poller struct {
	cfg Config
	log *slog.Logger
}

// Round is the outcome of one pass over every machine.
type Round struct {
	// Machines counts the machines polled (those the Filter kept).
	Machines int
	Failed   int
	Took     time.Duration
}

// New validates cfg.
func New(cfg Config) (*Poller, error) {
	if cfg.Source == nil {
		return nil, errors.New("poller: Config.Source is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 60 * time.Second
	}
	if cfg.Jitter < 0 || cfg.Jitter > 1 {
		return nil, errors.New("poller: Jitter must be within [0, 1]")
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = 0.1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 15 * time.Second
	}
	return &Poller{cfg: cfg, log: cfg.Logger}, nil
}

func (p *Poller) jitter(d time.Duration) time.Duration {
	j := float64(d) * p.cfg.Jitter
	return time.Duration(float64(d) - j + rand.Float64()*2*j)
}

// Run polls every Interval (± jitter) until ctx ends, then returns nil
// after the round in flight has stopped.
func (p *Poller) Run(ctx context.Context) error {
	// The first round starts after a short jittered delay, so a restart
	// of many appliances does not hit every BMC at once.
	t := time.NewTimer(time.Duration(rand.Float64() * float64(p.cfg.Interval) * p.cfg.Jitter))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r := p.Poll(ctx)
		if r.Failed > 0 {
			p.log.Warn("power poll round", "machines", r.Machines, "failed", r.Failed, "took", r.Took.String())
		} else {
			p.log.Debug("power poll round", "machines", r.Machines, "took", r.Took.String())
		}
		t.Reset(p.jitter(p.cfg.Interval))
	}
}

// Poll runs one round over every machine and waits for it. Starts are
// spread over the first Jitter fraction of the interval (capped at one
// second) so a large rack is not hit in one burst.
func (p *Poller) Poll(ctx context.Context) Round {
	start := time.Now()
	names, err := p.cfg.Source.PowerTargets(ctx)
	if err != nil {
		p.log.Warn("power poll: listing machines failed", "err", err)
		return Round{Took: time.Since(start)}
	}
	if f := p.cfg.Filter; f != nil {
		// A new slice: names is the Source's.
		names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !f(n) })
	}
	spread := min(time.Duration(float64(p.cfg.Interval)*p.cfg.Jitter), time.Second)
	var failed atomic.Int64
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, name := range names {
		delay := time.Duration(rand.Float64() * float64(spread))
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return Round{Machines: len(names), Failed: int(failed.Load()), Took: time.Since(start)}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return
				}
			}
			cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
			defer cancel()
			if err := p.cfg.Source.RefreshPower(cctx, name); err != nil {
				failed.Add(1)
				p.log.Debug("power poll failed", "machine", name, "err", err)
			}
		}()
	}
	wg.Wait()
	return Round{Machines: len(names), Failed: int(failed.Load()), Took: time.Since(start)}
}
