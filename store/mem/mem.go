// Package mem is an in-memory implementation of the store contract, meant
// for tests and single-process experiments. It owns nothing but its own map
// of records, the store-wide revision counter and the watcher fan-out;
// nothing is persisted, so "durable" in the contract means "visible to later
// calls on the same Store".
//
// It imports nothing of Corral's except the store contract
// (github.com/corralhq/corral/store).
package mem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/internal/watch"
)

// watchBuffer is the number of events a watcher may have pending before it
// is considered too slow and disconnected.
const watchBuffer = 256

type record struct {
	value []byte
	rev   int64
}

// Store is an in-memory store.Store. The zero value is not usable; call New.
type Store struct {
	mu     sync.RWMutex
	closed bool
	rev    int64             // last revision handed out
	recs   map[string]record // key -> record
	keys   []string          // sorted keys of recs
	hub    *watch.Hub
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.HistoryWatcher = (*Store)(nil)
)

// New returns an empty store at revision 0. It remembers the latest 16384
// events (at most 64 MiB) for WatchFrom.
func New() *Store { return NewWithHistory(0, 0) }

// NewWithHistory is New with the history's bounds (zero: the defaults),
// for tests of what happens when it overflows.
func NewWithHistory(events, bytes int) *Store {
	s := &Store{
		recs: make(map[string]record),
		hub:  watch.NewHub(watchBuffer, nil),
	}
	s.hub.SetHistory(events, bytes, 0)
	return s
}

// Get returns the record at key, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := ctx.Err(); err != nil {
		return store.KV{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.KV{}, store.ErrClosed
	}
	r, ok := s.recs[key]
	if !ok {
		return store.KV{}, fmt.Errorf("mem: get %q: %w", key, store.ErrNotFound)
	}
	return store.KV{Key: key, Value: slices.Clone(r.value), Revision: r.rev}, nil
}

// List returns every record whose key starts with prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, error) {
	kvs, _, err := s.ListRevision(ctx, prefix)
	return kvs, err
}

// ListRevision implements store.HistoryWatcher.
func (s *Store) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, 0, store.ErrClosed
	}
	out := []store.KV{}
	i, _ := slices.BinarySearch(s.keys, prefix)
	for ; i < len(s.keys) && strings.HasPrefix(s.keys[i], prefix); i++ {
		k := s.keys[i]
		r := s.recs[k]
		out = append(out, store.KV{Key: k, Value: slices.Clone(r.value), Revision: r.rev})
	}
	return out, s.rev, nil
}

// Revision implements store.HistoryWatcher.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, store.ErrClosed
	}
	return s.rev, nil
}

// WatchFrom implements store.HistoryWatcher from the in-memory ring of
// the latest events.
func (s *Store) WatchFrom(ctx context.Context, prefix string, afterRev int64) (<-chan store.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	if afterRev > s.rev || afterRev < 0 {
		return nil, fmt.Errorf("mem: watch %q: revision %d is beyond the store's current revision %d; re-list with from_revision 0: %w", prefix, afterRev, s.rev, store.ErrCompacted)
	}
	ch, err := s.hub.AddFrom(ctx, prefix, afterRev)
	if err != nil {
		return nil, fmt.Errorf("mem: watch %q: %w", prefix, err)
	}
	return ch, nil
}

// Put writes value at key if the record's current revision equals rev
// (rev 0: the key must not exist) and returns the new revision.
func (s *Store) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if key == "" {
		return 0, fmt.Errorf("mem: put: empty key")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, store.ErrClosed
	}
	cur, exists := s.recs[key]
	switch {
	case rev == 0 && exists:
		return 0, fmt.Errorf("mem: put %q: exists at revision %d: %w", key, cur.rev, store.ErrConflict)
	case rev != 0 && !exists:
		return 0, fmt.Errorf("mem: put %q at revision %d: key does not exist: %w", key, rev, store.ErrConflict)
	case exists && cur.rev != rev:
		return 0, fmt.Errorf("mem: put %q at revision %d: current revision is %d: %w", key, rev, cur.rev, store.ErrConflict)
	}
	s.rev++
	v := slices.Clone(value)
	s.recs[key] = record{value: v, rev: s.rev}
	if !exists {
		i, _ := slices.BinarySearch(s.keys, key)
		s.keys = slices.Insert(s.keys, i, key)
	}
	// Published under s.mu, so watchers see events in revision order.
	s.hub.Publish([]store.Event{{Type: store.EventPut, KV: store.KV{Key: key, Value: v, Revision: s.rev}}})
	return s.rev, nil
}

// Delete removes key if its current revision equals rev.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	cur, exists := s.recs[key]
	if !exists {
		return fmt.Errorf("mem: delete %q: %w", key, store.ErrNotFound)
	}
	if cur.rev != rev {
		return fmt.Errorf("mem: delete %q at revision %d: current revision is %d: %w", key, rev, cur.rev, store.ErrConflict)
	}
	s.rev++
	delete(s.recs, key)
	if i, ok := slices.BinarySearch(s.keys, key); ok {
		s.keys = slices.Delete(s.keys, i, i+1)
	}
	s.hub.Publish([]store.Event{{Type: store.EventDelete, KV: store.KV{Key: key, Revision: s.rev}}})
	return nil
}

// Watch streams changes to keys with the given prefix that happen after
// Watch returns. The channel is closed when ctx ends, the store closes, or
// the watcher falls more than a fixed number of events behind.
func (s *Store) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Holding s.mu while registering orders the registration against
	// writes: every write that completes after Watch returns is seen.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	return s.hub.Add(ctx, prefix), nil
}

// Close drops all records and closes every watch channel. Calls after Close
// return store.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.closed = true
	s.recs = nil
	s.keys = nil
	s.hub.CloseAll()
	return nil
}

// Update implements store.Updater with a compare-and-swap loop; fn runs
// without the store's lock held, so it may read the store.
func (s *Store) Update(ctx context.Context, key string, fn func(cur store.KV, exists bool) ([]byte, bool, error)) (store.KV, error) {
	for {
		if err := ctx.Err(); err != nil {
			return store.KV{}, err
		}
		cur, err := s.Get(ctx, key)
		exists := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return store.KV{}, err
		}
		val, del, err := fn(cur, exists)
		if err != nil {
			return store.KV{}, err
		}
		if del {
			if !exists {
				return store.KV{}, store.ErrNotFound
			}
			err = s.Delete(ctx, key, cur.Revision)
			if err == nil {
				return store.KV{Key: key}, nil
			}
		} else {
			var rev int64
			rev, err = s.Put(ctx, key, val, cur.Revision)
			if err == nil {
				return store.KV{Key: key, Value: append([]byte(nil), val...), Revision: rev}, nil
			}
		}
		if !errors.Is(err, store.ErrConflict) {
			return store.KV{}, err
		}
	}
}

// Txn implements store.Store's transaction: under the store's lock it
// checks every precondition, then applies every write at one new
// revision.
func (s *Store) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	if err := store.CheckTxn(ops); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, store.ErrClosed
	}
	for _, o := range ops {
		cur, exists := s.recs[o.Key]
		switch {
		case o.Rev == 0 && exists:
			return 0, fmt.Errorf("mem: txn: %q exists at revision %d: %w", o.Key, cur.rev, store.ErrConflict)
		case o.Rev != 0 && !exists:
			return 0, fmt.Errorf("mem: txn: %q at revision %d: key does not exist: %w", o.Key, o.Rev, store.ErrConflict)
		case exists && cur.rev != o.Rev:
			return 0, fmt.Errorf("mem: txn: %q at revision %d: current revision is %d: %w", o.Key, o.Rev, cur.rev, store.ErrConflict)
		}
	}
	writes := slices.ContainsFunc(ops, func(o store.Op) bool { return o.Kind != store.OpCheck })
	if !writes {
		return s.rev, nil
	}
	s.rev++
	var evs []store.Event
	for _, o := range ops {
		switch o.Kind {
		case store.OpPut:
			v := slices.Clone(o.Value)
			if _, exists := s.recs[o.Key]; !exists {
				i, _ := slices.BinarySearch(s.keys, o.Key)
				s.keys = slices.Insert(s.keys, i, o.Key)
			}
			s.recs[o.Key] = record{value: v, rev: s.rev}
			evs = append(evs, store.Event{Type: store.EventPut, KV: store.KV{Key: o.Key, Value: v, Revision: s.rev}})
		case store.OpDelete:
			delete(s.recs, o.Key)
			if i, ok := slices.BinarySearch(s.keys, o.Key); ok {
				s.keys = slices.Delete(s.keys, i, i+1)
			}
			evs = append(evs, store.Event{Type: store.EventDelete, KV: store.KV{Key: o.Key, Revision: s.rev}})
		case store.OpCheck:
			// A precondition only.
		}
	}
	s.hub.Publish(evs)
	return s.rev, nil
}
