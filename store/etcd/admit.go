package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/corralhq/corral/store"
)

// admission bounds the requests one appliance has at etcd. A storm offers
// many times what the cluster commits; without a bound every request is
// sent at once, etcd's apply falls behind until it refuses, and every
// caller's deadline expires together, so all the work is wasted. With it
// the surplus waits here, in arrival order, costing etcd nothing, and is
// refused (ResourceExhausted, with a hint of when to come back) when it
// has waited too long or too many wait already: the callers at the edge
// (agents, DHCP clients, boot firmware) retry on their own schedule.
//
// How many requests etcd can take at once depends on the cluster and on
// the machines it shares, so the bound adapts (additive increase,
// multiplicative decrease, as TCP's window): a request whose time at etcd
// stayed under the target (a fifth of the request deadline) raises it by
// 1/limit up to Options.MaxInFlight; a slower one, or one that ran out of
// time, cuts it by a quarter, at most once per target, down to minInFlight.
// The requests admitted then finish within their deadline instead of all
// expiring together.
type admission struct {
	mu        sync.Mutex
	inFlight  int
	limit     float64
	max       int
	queue     []*waiter
	maxQueued int
	wait      time.Duration
	target    time.Duration
	lastCut   time.Time
	log       *slog.Logger
	refused   atomic.Int64
	lastLog   atomic.Int64 // unix nanoseconds of the last refusal logged
}

// waiter is a request waiting for a turn; ready is closed when it is given
// one (admitted is then true).
type waiter struct {
	ready    chan struct{}
	admitted bool
}

// minInFlight is the least the bound falls to.
const minInFlight = 4

func newAdmission(inFlight, queued int, wait, target time.Duration, log *slog.Logger) *admission {
	return &admission{limit: float64(inFlight), max: inFlight, maxQueued: queued, wait: wait, target: target, log: log}
}

// RetryAfter is the pause a refusal suggests to its caller before it tries
// again (with its own jitter).
const RetryAfter = 2 * time.Second

// acquire waits for a turn; the caller gives it back with release.
func (a *admission) acquire(ctx context.Context, op, key string) error {
	a.mu.Lock()
	if len(a.queue) == 0 && a.inFlight < a.bound() {
		a.inFlight++
		a.mu.Unlock()
		return nil
	}
	if len(a.queue) >= a.maxQueued {
		a.mu.Unlock()
		return a.refuse(op, key, fmt.Sprintf("%d requests already wait for it", a.maxQueued))
	}
	w := &waiter{ready: make(chan struct{})}
	a.queue = append(a.queue, w)
	a.mu.Unlock()
	t := time.NewTimer(a.wait)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		err = fmt.Errorf("store/etcd: %s %s: waiting for a turn at the cluster: %w", op, key, ctx.Err())
	case <-t.C:
	}
	a.mu.Lock()
	if w.admitted { // given a turn as the wait ended
		a.mu.Unlock()
		if err == nil {
			return nil
		}
		a.release(0, false)
		return err
	}
	if i := slices.Index(a.queue, w); i >= 0 {
		a.queue = slices.Delete(a.queue, i, i+1)
	}
	a.mu.Unlock()
	if err != nil {
		return err
	}
	return a.refuse(op, key, fmt.Sprintf("no turn within %s", a.wait))
}

// bound is the current limit as a count (caller holds mu).
func (a *admission) bound() int { return max(minInFlight, int(a.limit)) }

// release gives a turn back after a request that spent took at etcd
// (slow: over the target or out of time), adapts the bound and admits
// the waiters it now allows.
func (a *admission) release(took time.Duration, slow bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight--
	now := time.Now()
	switch {
	case slow || took > a.target:
		if now.Sub(a.lastCut) >= a.target {
			a.limit = max(minInFlight, a.limit*0.75)
			a.lastCut = now
		}
	case took > 0:
		a.limit = min(float64(a.max), a.limit+1/a.limit)
	}
	for len(a.queue) > 0 && a.inFlight < a.bound() {
		w := a.queue[0]
		a.queue = a.queue[1:]
		w.admitted = true
		a.inFlight++
		close(w.ready)
	}
}

// refuse counts and describes a request not admitted, logging at most one
// refusal a second (with the count so far).
func (a *admission) refuse(op, key, why string) error {
	n := a.refused.Add(1)
	now := time.Now().UnixNano()
	if last := a.lastLog.Load(); now-last >= int64(time.Second) && a.lastLog.CompareAndSwap(last, now) {
		a.mu.Lock()
		inFlight, bound, waiting := a.inFlight, a.bound(), len(a.queue)
		a.mu.Unlock()
		a.log.Warn("etcd saturated: request refused; the caller is told to retry", "op", op, "key", key, "why", why,
			"in_flight", inFlight, "bound", bound, "waiting", waiting, "refused_total", n)
	}
	return fmt.Errorf("store/etcd: %s %s: the appliance's store is saturated (%s); retry in about %s, with jitter: %w", op, key, why, RetryAfter, store.ErrBusy)
}

// Refused is how many requests the store refused for want of a turn.
func (s *Store) Refused() int64 { return s.adm.refused.Load() }

// do runs one read of etcd (writes go through group.go): it waits for a
// turn, then runs call with RequestTimeout from the moment it is
// admitted, retrying any failure but a final one (retry) within that
// deadline. Errors come back in the store's vocabulary (wrap).
func (s *Store) do(ctx context.Context, op, key string, call func(ctx context.Context) error) error {
	if err := s.adm.acquire(ctx, op, key); err != nil {
		return err
	}
	start := time.Now()
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	defer func() { s.adm.release(time.Since(start), rctx.Err() != nil && ctx.Err() == nil) }()
	if err := s.retry(rctx, true, call); err != nil {
		return s.wrap(ctx, op, key, err)
	}
	return nil
}

// retry runs call until it succeeds, fails for good or rctx ends:
// etcd's refusals that commit nothing are sent again (with a jittered
// back-off), and any failure of a read. The error is etcd's own.
func (s *Store) retry(rctx context.Context, read bool, call func(ctx context.Context) error) error {
	pause := backoff.ExponentialBackOff{InitialInterval: 20 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 500 * time.Millisecond}
	for {
		err := call(rctx)
		if err == nil {
			return nil
		}
		if rctx.Err() != nil || !(uncommitted(err) || read && retryableRead(err)) {
			return err
		}
		if sleep(rctx, pause.NextBackOff()) != nil {
			return err
		}
	}
}

// uncommitted reports whether etcd refused a request before proposing it,
// so that sending it again cannot apply it twice.
func uncommitted(err error) bool {
	for _, e := range []error{rpctypes.ErrTooManyRequests, rpctypes.ErrGRPCRequestTooManyRequests, rpctypes.ErrNoLeader, rpctypes.ErrGRPCNoLeader, rpctypes.ErrNotCapable} {
		if errors.Is(err, e) {
			return true
		}
	}
	m := err.Error()
	return strings.Contains(m, rpctypes.ErrTooManyRequests.Error()) || strings.Contains(m, rpctypes.ErrNoLeader.Error())
}

// retryableRead reports whether a failed read may simply be sent again: any
// failure but a compaction or a request etcd will never take.
func retryableRead(err error) bool {
	for _, e := range []error{rpctypes.ErrGRPCCompacted, rpctypes.ErrCompacted, rpctypes.ErrGRPCRequestTooLarge, rpctypes.ErrRequestTooLarge, rpctypes.ErrGRPCFutureRev, rpctypes.ErrFutureRev} {
		if errors.Is(err, e) {
			return false
		}
	}
	return true
}
