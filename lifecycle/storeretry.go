package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// A store that is saturated (a storm on a shared etcd) or briefly without
// an answer refuses or times out a write that a moment later commits. An
// agent's report that such a write would record (an install step, its
// certificate request) is not the agent's to send again, so the lifecycle
// tries again itself rather than failing the install for a store's
// moment.

// storeRetryFor bounds how long one report's write is tried again.
const storeRetryFor = time.Minute

// transientStore reports whether err is a store failure a later attempt
// may not meet: no answer in time, or a refusal for saturation.
func transientStore(err error) bool {
	return errors.Is(err, apierr.ErrUnavailable) || errors.Is(err, apierr.ErrExhausted)
}

// updateMachineRetrying is UpdateMachine tried again while it fails
// transiently (retryStore). mutate must set everything it reports from
// scratch: it may run again on a newer record.
func (l *Lifecycle) updateMachineRetrying(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error) (*inventoryv1.Machine, error) {
	var m *inventoryv1.Machine
	err := l.retryStore(ctx, name, func() (err error) {
		m, err = l.inv.UpdateMachine(ctx, name, mutate)
		return err
	})
	return m, err
}

// retryStore runs call again, with a jittered back-off (0.5 s doubling
// to 8 s) for at most storeRetryFor, while it fails transiently, and
// returns its last error.
func (l *Lifecycle) retryStore(ctx context.Context, machine string, call func() error) error {
	pause := backoff.ExponentialBackOff{InitialInterval: 500 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 8 * time.Second}
	deadline := time.Now().Add(storeRetryFor)
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil || !transientStore(err) {
			return err
		}
		d := pause.NextBackOff()
		if time.Now().Add(d).After(deadline) {
			return err
		}
		l.log.Info("store busy: recording the agent's report again", "machine", machine, "attempt", attempt, "in", d.Round(time.Millisecond), "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
