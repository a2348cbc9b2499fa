// Package watch is the watcher fan-out shared by the store backends: it
// delivers committed events to Watch subscribers in order and disconnects a
// subscriber that falls behind instead of blocking writers. It also keeps a
// bounded ring of the latest events (by count and by bytes), from which
// WatchFrom subscribers get the changes they missed. It imports only the
// store contract.
package watch

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/corralhq/corral/store"
)

// Default history bounds (HistoryOptions zero values).
const (
	DefaultHistoryEvents = 16384
	DefaultHistoryBytes  = 64 << 20
)

// watcher is one Watch subscription. ch is buffered; when it is full the
// watcher is dropped instead of blocking the writer.
type watcher struct {
	prefix string
	after  int64 // events at or below this revision are not for it
	ch     chan store.Event
	stop   func() bool // releases the context.AfterFunc registration
}

// Hub fans events out to watchers and remembers the latest ones. Publish
// never blocks; all methods are safe for concurrent use.
type Hub struct {
	mu       sync.Mutex
	buf      int
	log      *slog.Logger
	watchers map[*watcher]struct{}

	// The history: ring holds the latest events in revision order; every
	// event with a revision > oldest is in it (oldest is the revision the
	// history starts after: the store's revision when the hub was made,
	// or the last event dropped from the ring).
	ring      []store.Event
	head, n   int // ring[head] is the oldest of n events
	bytes     int
	maxBytes  int
	oldest    int64
	latest    int64 // newest revision published (or oldest when none)
	histories bool
}

// NewHub returns a hub whose watchers buffer up to buf events; log (may be
// nil) hears about watchers that are dropped. It keeps no history until
// SetHistory.
func NewHub(buf int, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{buf: buf, log: log, watchers: make(map[*watcher]struct{})}
}

// SetHistory makes the hub keep the latest events (at most events of them
// and at most bytes of keys and values; zero or negative takes the
// defaults) for AddFrom. rev is the store's current revision: the history
// starts after it. Call it before the first Publish.
func (h *Hub) SetHistory(events, bytes int, rev int64) {
	if events <= 0 {
		events = DefaultHistoryEvents
	}
	if bytes <= 0 {
		bytes = DefaultHistoryBytes
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring = make([]store.Event, events)
	h.head, h.n, h.bytes = 0, 0, 0
	h.maxBytes = bytes
	h.oldest, h.latest = rev, rev
	h.histories = true
}

// Add registers a watcher that is removed (and its channel closed) when ctx
// ends.
func (h *Hub) Add(ctx context.Context, prefix string) <-chan store.Event {
	w := &watcher{prefix: prefix, ch: make(chan store.Event, h.buf)}
	h.mu.Lock()
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	h.arm(ctx, w)
	return w.ch
}

// AddFrom registers a watcher that first receives the remembered events
// after afterRev with its prefix, then every event published later with a
// revision > afterRev. It returns an error wrapping store.ErrCompacted when
// the history no longer holds every event after afterRev. The caller checks
// that afterRev is not beyond the store's committed revision (events
// committed but not yet published are delivered when they are).
func (h *Hub) AddFrom(ctx context.Context, prefix string, afterRev int64) (<-chan store.Event, error) {
	h.mu.Lock()
	if !h.histories {
		h.mu.Unlock()
		return nil, fmt.Errorf("this store keeps no history: %w", store.ErrCompacted)
	}
	if afterRev < h.oldest {
		oldest := h.oldest
		h.mu.Unlock()
		return nil, fmt.Errorf("revision %d is compacted: the oldest revision this store can resume from is %d; re-list with from_revision 0: %w", afterRev, oldest, store.ErrCompacted)
	}
	var backlog []store.Event
	for i := range h.n {
		ev := h.ring[(h.head+i)%len(h.ring)]
		if ev.KV.Revision > afterRev && strings.HasPrefix(ev.KV.Key, prefix) {
			ev.KV.Value = slices.Clone(ev.KV.Value)
			backlog = append(backlog, ev)
		}
	}
	w := &watcher{prefix: prefix, after: afterRev, ch: make(chan store.Event, len(backlog)+h.buf)}
	for _, ev := range backlog {
		w.ch <- ev
	}
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	h.arm(ctx, w)
	return w.ch, nil
}

// arm removes w when ctx ends.
func (h *Hub) arm(ctx context.Context, w *watcher) {
	// Set stop after registration; remove tolerates a nil stop because the
	// AfterFunc may run before the assignment below is visible to it.
	stop := context.AfterFunc(ctx, func() { h.remove(w) })
	h.mu.Lock()
	w.stop = stop
	h.mu.Unlock()
}

// remove unregisters w and closes its channel, if it is still registered.
func (h *Hub) remove(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropLocked(w)
}

func (h *Hub) dropLocked(w *watcher) {
	if _, ok := h.watchers[w]; !ok {
		return
	}
	delete(h.watchers, w)
	close(w.ch)
	if w.stop != nil {
		w.stop()
	}
}

// Publish delivers events, in order, to every watcher whose prefix matches,
// and remembers them when the hub keeps a history. A watcher whose buffer
// is full is dropped. Each watcher gets its own copy of the values. Events
// must come in revision order.
func (h *Hub) Publish(events []store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.histories {
		for _, ev := range events {
			h.rememberLocked(ev)
		}
	}
	for w := range h.watchers {
		for _, ev := range events {
			if ev.KV.Revision <= w.after || !strings.HasPrefix(ev.KV.Key, w.prefix) {
				continue
			}
			ev.KV.Value = slices.Clone(ev.KV.Value)
			select {
			case w.ch <- ev:
			default:
				h.log.Warn("store watcher fell behind; disconnecting it", "prefix", w.prefix, "buffer", cap(w.ch))
				h.dropLocked(w)
			}
			if _, ok := h.watchers[w]; !ok {
				break
			}
		}
	}
}

func evSize(ev store.Event) int { return len(ev.KV.Key) + len(ev.KV.Value) + 64 }

// rememberLocked appends ev to the ring, dropping the oldest events while
// the ring is over either bound.
func (h *Hub) rememberLocked(ev store.Event) {
	if ev.KV.Revision < h.latest || (ev.KV.Revision == h.latest && h.rememberedLocked(ev.KV.Key)) {
		return // already remembered (or from before the history started)
	}
	ev.KV.Value = slices.Clone(ev.KV.Value)
	size := evSize(ev)
	for h.n > 0 && (h.n == len(h.ring) || h.bytes+size > h.maxBytes) {
		old := h.ring[h.head]
		h.ring[h.head] = store.Event{}
		h.head = (h.head + 1) % len(h.ring)
		h.n--
		h.bytes -= evSize(old)
		h.oldest = old.KV.Revision
	}
	if size > h.maxBytes {
		// Too big to remember at all: the history starts after it.
		h.oldest, h.latest = ev.KV.Revision, ev.KV.Revision
		return
	}
	h.ring[(h.head+h.n)%len(h.ring)] = ev
	h.n++
	h.bytes += size
	h.latest = ev.KV.Revision
}

// rememberedLocked says whether the ring's newest revision already holds
// an event for key: the events of one transaction share a revision, one
// per key.
func (h *Hub) rememberedLocked(key string) bool {
	for i := h.n - 1; i >= 0; i-- {
		ev := h.ring[(h.head+i)%len(h.ring)]
		if ev.KV.Revision != h.latest {
			return false
		}
		if ev.KV.Key == key {
			return true
		}
	}
	// The latest revision was too big to remember, or nothing is kept.
	return h.n == 0 || h.ring[(h.head+h.n-1)%len(h.ring)].KV.Revision != h.latest
}

// Oldest is the revision the history starts after: AddFrom accepts any
// afterRev >= Oldest.
func (h *Hub) Oldest() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.oldest
}

// CloseAll drops every watcher.
func (h *Hub) CloseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		h.dropLocked(w)
	}
}

// SetBuffer changes the buffer size of watchers added afterwards.
func (h *Hub) SetBuffer(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf = n
}
