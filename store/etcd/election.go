package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultLeaseTTL is how long a leader that stops renewing its lease (dead,
// partitioned) keeps the lead: another appliance takes over within it.
const DefaultLeaseTTL = 15 * time.Second

// electionKey is where candidates queue, under the store's prefix and
// outside every record prefix.
const electionKey = "/_election/leader"

// Elector campaigns for the fleet's leadership through etcd's concurrency
// package: each candidate holds a key bound to its own lease; the oldest key
// leads. A leader that dies or is cut off stops renewing the lease, etcd
// deletes its key when the TTL runs out, and the next candidate leads.
type Elector struct {
	s    *Store
	name string
	ttl  time.Duration
	log  *slog.Logger
}

// NewElector returns an elector for the appliance called name. ttl is the
// lease TTL (whole seconds, at least 2; 0 = DefaultLeaseTTL).
func NewElector(s *Store, name string, ttl time.Duration, log *slog.Logger) (*Elector, error) {
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl < 2*time.Second || ttl%time.Second != 0 {
		return nil, fmt.Errorf("leader lease TTL %s: want whole seconds, at least 2s", ttl)
	}
	if name == "" {
		return nil, errors.New("elector: empty appliance name")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Elector{s: s, name: name, ttl: ttl, log: log}, nil
}

// Lead blocks until this appliance leads, then returns a context that ends
// when the lead is lost: the lease could not be renewed within its TTL, or
// ctx ended (then the lead is resigned at once so a peer takes over without
// waiting for the TTL).
func (e *Elector) Lead(ctx context.Context) (context.Context, error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		lctx, err := e.campaign(ctx)
		if err == nil {
			return lctx, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e.log.Warn("leader campaign failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(min(attempt+1, 5)) * time.Second):
		}
	}
}

func (e *Elector) campaign(ctx context.Context) (context.Context, error) {
	// The session's keepalive does not end with ctx: a session bound to
	// ctx was Done as soon as ctx ended, racing the step-down below (half
	// the graceful stops took the "lease lost" branch and never resigned,
	// and Close could not revoke with an ended context: the next candidate
	// waited for the TTL). It ends when this campaign or lead is over.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	sess, err := concurrency.NewSession(e.s.cli, concurrency.WithTTL(int(e.ttl/time.Second)), concurrency.WithContext(sctx))
	if err != nil {
		scancel()
		return nil, fmt.Errorf("lease: %w", err)
	}
	el := concurrency.NewElection(sess, e.s.prefix+electionKey)
	// Campaign waits for every older candidate's key to go. A session that
	// expires while waiting loses its key, so check it still holds the
	// oldest key afterwards.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	err = el.Campaign(cctx, e.name)
	if err == nil && sess.Done() != nil {
		select {
		case <-sess.Done():
			err = errors.New("lease expired while campaigning")
		default:
		}
	}
	if err == nil {
		var resp *clientv3.GetResponse
		rctx, rcancel := e.s.reqCtx(ctx)
		resp, err = e.s.cli.Get(rctx, e.s.prefix+electionKey+"/", clientv3.WithFirstCreate()...)
		rcancel()
		if err == nil && (len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != el.Key()) {
			err = errors.New("campaign returned without holding the oldest key")
		}
	}
	if err != nil {
		cancel()
		sess.Close()
		scancel()
		return nil, err
	}
	e.log.Info("leading the fleet", "appliance", e.name, "lease_ttl", e.ttl.String(), "lease", fmt.Sprintf("%x", sess.Lease()))
	go func() {
		select {
		case <-sess.Done():
			e.log.Warn("leadership lost: the lease was not renewed within its TTL", "appliance", e.name, "lease_ttl", e.ttl.String())
		case <-cctx.Done():
			// Step down at once (ctx ended): resign and revoke the lease so
			// the next candidate does not wait for the TTL.
			rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := el.Resign(rctx); err != nil {
				e.log.Warn("resign failed; the lease expires on its own", "err", err)
			}
			rcancel()
		}
		cancel()
		sess.Close() // revokes the lease
		scancel()
	}()
	return cctx, nil
}

// Leader names the current leader ("" while none is elected).
func (e *Elector) Leader(ctx context.Context) (string, error) {
	rctx, cancel := e.s.reqCtx(ctx)
	defer cancel()
	resp, err := e.s.cli.Get(rctx, e.s.prefix+electionKey+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", e.s.wrap(ctx, "leader", electionKey, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
