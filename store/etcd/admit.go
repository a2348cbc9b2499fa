package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/corralhq/corral/internal/apierr"
)

// admission bounds the requests one appliance has at etcd. A storm offers
// many times what the cluster commits; without a bound every request is
// sent at once, etcd's apply falls behind until it refuses, and every
// caller's deadline expires together, so all the work is wasted. With it
// the surplus waits here, in arrival order, costing etcd nothing, and is
// refused (ResourceExhausted, with a hint of when to come back) when it
// has waited too long or too many wait already: the callers at the edge
// (agents, DHCP clients, boot firmware) retry on their own schedule.
type admission struct {
	slots     chan struct{}
	waiting   atomic.Int64
	maxQueued int64
	wait      time.Duration
	log       *slog.Logger
	refused   atomic.Int64
	lastLog   atomic.Int64 // unix nanoseconds of the last refusal logged
}

func newAdmission(inFlight, queued int, wait time.Duration, log *slog.Logger) *admission {
	return &admission{slots: make(chan struct{}, inFlight), maxQueued: int64(queued), wait: wait, log: log}
}

// RetryAfter is the pause a refusal suggests to its caller before it tries
// again (with its own jitter).
const RetryAfter = 2 * time.Second

// acquire waits for a turn; the returned function gives it back.
func (a *admission) acquire(ctx context.Context, op, key string) (func(), error) {
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	default:
	}
	if a.waiting.Add(1) > a.maxQueued {
		a.waiting.Add(-1)
		return nil, a.refuse(op, key, fmt.Sprintf("%d requests already wait for it", a.maxQueued))
	}
	defer a.waiting.Add(-1)
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("store/etcd: %s %s: waiting for a turn at the cluster: %w", op, key, ctx.Err())
	case <-t.C:
		return nil, a.refuse(op, key, fmt.Sprintf("no turn within %s", a.wait))
	}
}

func (a *admission) release() { <-a.slots }

// refuse counts and describes a request not admitted, logging at most one
// refusal a second (with the count so far).
func (a *admission) refuse(op, key, why string) error {
	n := a.refused.Add(1)
	now := time.Now().UnixNano()
	if last := a.lastLog.Load(); now-last >= int64(time.Second) && a.lastLog.CompareAndSwap(last, now) {
		a.log.Warn("etcd saturated: request refused; the caller is told to retry", "op", op, "key", key, "why", why,
			"in_flight", len(a.slots), "waiting", a.waiting.Load(), "refused_total", n)
	}
	return apierr.Exhaustedf("store/etcd: %s %s: the appliance's store is saturated (%s); retry in about %s, with jitter", op, key, why, RetryAfter)
}

// Refused is how many requests the store refused for want of a turn.
func (s *Store) Refused() int64 { return s.adm.refused.Load() }

// do runs one request to etcd: it waits for a turn, then runs call with
// RequestTimeout from the moment it is admitted, retrying (with a
// jittered back-off, within that deadline) etcd's refusals that commit
// nothing, and any failure of a read. Errors come back in the store's
// vocabulary (wrap).
func (s *Store) do(ctx context.Context, op, key string, read bool, call func(ctx context.Context) error) error {
	release, err := s.adm.acquire(ctx, op, key)
	if err != nil {
		return err
	}
	defer release()
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	pause := backoff.ExponentialBackOff{InitialInterval: 20 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 500 * time.Millisecond}
	for {
		err := call(rctx)
		if err == nil {
			return nil
		}
		if rctx.Err() != nil || !(uncommitted(err) || read && retryableRead(err)) {
			return s.wrap(ctx, op, key, err)
		}
		if sleep(rctx, pause.NextBackOff()) != nil {
			return s.wrap(ctx, op, key, err)
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
