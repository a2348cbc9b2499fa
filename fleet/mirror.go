package fleet

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/store"
)

// errOverBound stops a mirror's read at its bound.
var errOverBound = errors.New("more records than the bound")

// errWatchEnded: the store closed a watch (a watcher that fell behind is
// disconnected); the mirror lists again.
var errWatchEnded = errors.New("store watch ended")

// item is one mirrored record: its decoded value, its store revision, and
// bad when the value could not be decoded (the key exists all the same).
type item[V any] struct {
	v   V
	rev int64
	bad bool
}

// mirror keeps an in-memory copy of the records under one prefix: a store
// watch keeps it current, and it lists the prefix again whenever the watch
// ends. It holds at most max records (truncated says some were left out).
// All methods are safe for concurrent use; its lock is never held across a
// store call.
type mirror[V any] struct {
	st     store.Store
	prefix string
	what   string // "machine", for logs
	max    int
	decode func(b []byte) (V, error)
	// matters says whether a change is worth waking the consumer for (nil:
	// every change is); it sees the previous item (had=false when new)
	// and the next one (has=false when deleted).
	matters func(prev item[V], had bool, next item[V], has bool) bool
	// changed, when set, gets a token (never blocking) after a change that
	// matters and after every re-list.
	changed chan struct{}
	log     *slog.Logger

	skipped lograte.Counter

	mu        sync.RWMutex
	items     map[string]item[V]
	truncated bool
	synced    chan struct{} // closed after the first list
	syncOnce  sync.Once
}

func newMirror[V any](st store.Store, prefix, what string, limit int, log *slog.Logger, decode func([]byte) (V, error)) *mirror[V] {
	return &mirror[V]{st: st, prefix: prefix, what: what, max: limit, log: log, decode: decode,
		items: map[string]item[V]{}, synced: make(chan struct{})}
}

// run follows the prefix until ctx ends, then returns nil. A failed watch
// or list is retried with a growing delay (up to 5 s).
func (m *mirror[V]) run(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		err := m.follow(ctx)
		select {
		case <-ctx.Done():
			return nil // ended by ctx, as documented; err is that ending
		default:
		}
		if errors.Is(err, errWatchEnded) {
			m.log.Info("store watch ended; listing again", "prefix", m.prefix)
			delay = 100 * time.Millisecond
		} else {
			m.log.Warn("following store records failed; retrying", "prefix", m.prefix, "err", err, "retry_in", delay.String())
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// follow reads the prefix a page at a time and watches it from the
// first page's revision (a store without history: watches, then reads, so
// no change between the two is missed), then applies events until the
// watch ends or ctx does.
func (m *mirror[V]) follow(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hw, history := store.AsHistoryWatcher(m.st)
	var ch <-chan store.Event
	if !history {
		var err error
		if ch, err = m.st.Watch(wctx, m.prefix); err != nil {
			return err
		}
	}
	rev, err := m.load(ctx)
	if err != nil {
		return err
	}
	if history {
		if ch, err = hw.WatchFrom(wctx, m.prefix, rev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-ch:
			if !ok {
				return errWatchEnded
			}
			m.apply(ev)
		}
	}
}

// loadPage is how many records one store read of load takes: a few MB of
// machines with realistic facts, of which the mirror keeps what decode
// returns.
const loadPage = 1024

// load replaces the contents with the prefix's records, read loadPage at
// a time (store.ScanPages), so that it holds one page of whole records
// and the decoded values, never the whole prefix at once. It returns the
// revision the first page was read at.
func (m *mirror[V]) load(ctx context.Context) (int64, error) {
	next := map[string]item[V]{}
	truncated := false
	rev, err := store.ScanPages(ctx, m.st, m.prefix, loadPage, func(kvs []store.KV) error {
		for _, kv := range kvs {
			if len(next) >= m.max {
				truncated = true
				m.overBound(kv.Key)
				return errOverBound
			}
			next[m.name(kv.Key)] = m.itemOf(kv)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errOverBound) {
		return 0, err
	}
	m.mu.Lock()
	m.items, m.truncated = next, truncated
	m.mu.Unlock()
	m.syncOnce.Do(func() { close(m.synced) })
	m.notify()
	return rev, nil
}

func (m *mirror[V]) name(key string) string { return strings.TrimPrefix(key, m.prefix) }

func (m *mirror[V]) itemOf(kv store.KV) item[V] {
	v, err := m.decode(kv.Value)
	if err != nil {
		m.skipped.Add(1, func(n int64) {
			m.log.Warn("undecodable record kept as present without a value", "key", kv.Key, "err", err, "count", n)
		})
		var zero V
		return item[V]{v: zero, rev: kv.Revision, bad: true}
	}
	return item[V]{v: v, rev: kv.Revision}
}

func (m *mirror[V]) overBound(key string) {
	m.skipped.Add(1, func(n int64) {
		m.log.Warn("more records than the bound; the rest are ignored", "what", m.what, "max", m.max, "key", key, "count", n)
	})
}

// apply applies one watched event. Events not newer than the mirrored
// revision of their key (replayed from before the list, or a write the
// consumer already set) are skipped.
func (m *mirror[V]) apply(ev store.Event) {
	name := m.name(ev.KV.Key)
	has := ev.Type == store.EventPut
	var next item[V]
	if has {
		next = m.itemOf(ev.KV)
	}
	m.mu.Lock()
	prev, had := m.items[name]
	switch {
	case had && ev.KV.Revision <= prev.rev:
		m.mu.Unlock()
		return
	case has && !had && len(m.items) >= m.max:
		m.truncated = true
		m.mu.Unlock()
		m.overBound(ev.KV.Key)
		return
	case has:
		m.items[name] = next
	default:
		delete(m.items, name)
	}
	m.mu.Unlock()
	if m.matters == nil || m.matters(prev, had, next, has) {
		m.notify()
	}
}

func (m *mirror[V]) notify() {
	if m.changed == nil {
		return
	}
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// wait blocks until the first list has been applied or ctx ends.
func (m *mirror[V]) wait(ctx context.Context) error {
	select {
	case <-m.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isSynced reports whether the first list has been applied.
func (m *mirror[V]) isSynced() bool {
	select {
	case <-m.synced:
		return true
	default:
		return false
	}
}

func (m *mirror[V]) get(name string) (item[V], bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	it, ok := m.items[name]
	return it, ok
}

// snapshot returns a copy of the contents and whether some records were
// left out by the bound.
func (m *mirror[V]) snapshot() (map[string]item[V], bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return maps.Clone(m.items), m.truncated
}

// set records a write the consumer made itself (so its next look does not
// wait for the watch); a newer revision already mirrored wins.
func (m *mirror[V]) set(name string, v V, rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.items[name]; ok && cur.rev >= rev {
		return
	}
	if _, ok := m.items[name]; !ok && len(m.items) >= m.max {
		m.truncated = true
		return
	}
	m.items[name] = item[V]{v: v, rev: rev}
}

// drop records a delete the consumer made itself.
func (m *mirror[V]) drop(name string, rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.items[name]; ok && cur.rev <= rev {
		delete(m.items, name)
	}
}

// count returns how many mirrored values satisfy f.
func (m *mirror[V]) count(f func(V) bool) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, it := range m.items {
		if !it.bad && f(it.v) {
			n++
		}
	}
	return n
}
