package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/corralhq/corral/store"
	"github.com/prometheus/client_golang/prometheus"
)

// storeMetrics times the store's writes: corral_store_commit_seconds{op,
// outcome}, op put, delete, update or txn, outcome ok, conflict, not_found or
// error.
type storeMetrics struct {
	commit *prometheus.HistogramVec
}

func newStoreMetrics() *storeMetrics {
	return &storeMetrics{commit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "corral_store_commit_seconds",
		Help: "Store writes (durable when they return), by operation (put, delete, update, txn) and outcome (ok, conflict, not_found, error).",
		// bbolt group-commits in about a millisecond to tens of them
		// (fsync); etcd adds a network round trip and its own fsync.
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op", "outcome"})}
}

func (m *storeMetrics) observe(op string, start time.Time, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, store.ErrConflict):
		outcome = "conflict"
	case errors.Is(err, store.ErrNotFound):
		outcome = "not_found"
	default:
		outcome = "error"
	}
	m.commit.WithLabelValues(op, outcome).Observe(time.Since(start).Seconds())
}

// wrap returns st timed by m. Reads and watches pass through untimed. A
// store that is already timed is returned as is.
//
// A decorator hides its inner store's optional interfaces, so they are
// forwarded explicitly: when st is a store.Updater, store.HistoryWatcher
// and store.Snapshotter (every backend of this repository is), so is the
// result (record.Update keeps its atomic path, watches resume, the backup
// reads one revision); otherwise the result is the plain decorator, whose
// Unwrap (store.Unwrapper) lets store.AsHistoryWatcher and the like find
// them underneath.
func (m *storeMetrics) wrap(st store.Store) store.Store {
	switch st.(type) {
	case *meteredStore, *meteredUpdater, *meteredFull:
		return st
	}
	ms := &meteredStore{inner: st, m: m}
	u, okU := st.(store.Updater)
	h, okH := st.(store.HistoryWatcher)
	sn, okS := st.(store.Snapshotter)
	switch {
	case okU && okH && okS:
		return &meteredFull{meteredUpdater: &meteredUpdater{meteredStore: ms, u: u}, h: h, sn: sn}
	case okU:
		return &meteredUpdater{meteredStore: ms, u: u}
	}
	return ms
}

// meteredStore times Put, Delete and Txn.
type meteredStore struct {
	inner store.Store
	m     *storeMetrics
}

var _ store.Store = (*meteredStore)(nil)

// Unwrap returns the store being timed.
func (s *meteredStore) Unwrap() store.Store { return s.inner }

func (s *meteredStore) Get(ctx context.Context, key string) (store.KV, error) {
	return s.inner.Get(ctx, key)
}

func (s *meteredStore) List(ctx context.Context, prefix string) ([]store.KV, error) {
	return s.inner.List(ctx, prefix)
}

func (s *meteredStore) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	start := time.Now()
	r, err := s.inner.Put(ctx, key, value, rev)
	s.m.observe("put", start, err)
	return r, err
}

func (s *meteredStore) Delete(ctx context.Context, key string, rev int64) error {
	start := time.Now()
	err := s.inner.Delete(ctx, key, rev)
	s.m.observe("delete", start, err)
	return err
}

func (s *meteredStore) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	start := time.Now()
	r, err := s.inner.Txn(ctx, ops)
	s.m.observe("txn", start, err)
	return r, err
}

func (s *meteredStore) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	return s.inner.Watch(ctx, prefix)
}

func (s *meteredStore) Close() error { return s.inner.Close() }

// meteredUpdater is a meteredStore over a store.Updater; it times Update.
type meteredUpdater struct {
	*meteredStore
	u store.Updater
}

// meteredFull is a meteredUpdater over a store with every optional
// interface; it forwards the rest.
type meteredFull struct {
	*meteredUpdater
	h  store.HistoryWatcher
	sn store.Snapshotter
}

var (
	_ store.Updater        = (*meteredFull)(nil)
	_ store.HistoryWatcher = (*meteredFull)(nil)
	_ store.Snapshotter    = (*meteredFull)(nil)
	_ store.Unwrapper      = (*meteredFull)(nil)
)

func (s *meteredUpdater) Update(ctx context.Context, key string, fn func(cur store.KV, exists bool) ([]byte, bool, error)) (store.KV, error) {
	start := time.Now()
	kv, err := s.u.Update(ctx, key, fn)
	s.m.observe("update", start, err)
	return kv, err
}

func (s *meteredFull) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	return s.h.ListRevision(ctx, prefix)
}

func (s *meteredFull) Revision(ctx context.Context) (int64, error) {
	return s.h.Revision(ctx)
}

func (s *meteredFull) WatchFrom(ctx context.Context, prefix string, afterRev int64) (<-chan store.Event, error) {
	return s.h.WatchFrom(ctx, prefix, afterRev)
}

func (s *meteredFull) Snapshot(ctx context.Context) (int64, []store.KV, error) {
	return s.sn.Snapshot(ctx)
}
