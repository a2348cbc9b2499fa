package pool

import (
	"context"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/record"
)

// Heartbeat timing (docs/architecture.md): agents beat every 10 s by re-applying
// their Node; a node silent for HeartbeatTimeout is NOT_READY, checked
// every SweepInterval.
const (
	DefaultHeartbeatTimeout = 30 * time.Second
	DefaultSweepInterval    = 15 * time.Second
)

// Sweeper marks nodes whose heartbeat is older than Timeout NOT_READY. A
// node becomes READY again when its agent next applies it.
type Sweeper struct {
	Pool     *Pool
	Timeout  time.Duration // default DefaultHeartbeatTimeout
	Interval time.Duration // default DefaultSweepInterval
}

// Run sweeps until ctx ends; it returns nil then.
func (s *Sweeper) Run(ctx context.Context) error {
	interval := s.Interval
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.SweepOnce(ctx); err != nil && ctx.Err() == nil {
				s.Pool.log.Warn("node heartbeat sweep failed", "err", err)
			}
		}
	}
}

// SweepOnce marks every READY node silent for longer than Timeout
// NOT_READY, by CAS on each node (a heartbeat racing the sweep wins).
func (s *Sweeper) SweepOnce(ctx context.Context) error {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultHeartbeatTimeout
	}
	p := s.Pool
	nodes, err := p.ListNodes(ctx)
	if err != nil {
		return err
	}
	now := p.cfg.Now()
	for _, n := range nodes {
		// ListNodes has overlaid this process's beats (beats.go).
		if n.GetState() != poolv1.Node_READY || now.Sub(p.lastBeat(n)) <= timeout {
			continue
		}
		var changed bool
		_, err := record.Mutate(ctx, p.cfg.Store, nodePrefix+n.GetName(), newNode, func(cur *poolv1.Node, exists bool) (bool, error) {
			changed = false
			if !exists || cur.GetState() != poolv1.Node_READY || now.Sub(p.lastBeat(cur)) <= timeout {
				return false, errNoChange
			}
			cur.State = poolv1.Node_NOT_READY
			changed = true
			return false, nil
		})
		if err != nil && err != errNoChange {
			return err
		}
		if changed {
			p.log.Warn("node missed its heartbeats: NOT_READY", "node", n.GetName(),
				"last_heartbeat", n.GetLastHeartbeat().AsTime().UTC().Format(time.RFC3339), "timeout", timeout.String())
		}
	}
	return nil
}

// errNoChange aborts a mutation that has nothing to do.
var errNoChange = preconditionf("no change")
