// Package watch is the watcher fan-out shared by the store backends: it
// delivers committed events to Watch subscribers in order and disconnects a
// subscriber that falls behind instead of blocking writers. It imports only
// the store contract.
package watch

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/corralhq/corral/store"
)

// watcher is one Watch subscription. ch is buffered; when it is full the
// watcher is dropped instead of blocking the writer.
type watcher struct {
	prefix string
	ch     chan store.Event
	stop   func() bool // releases the context.AfterFunc registration
}

// Hub fans events out to watchers. Publish never blocks; all methods are
// safe for concurrent use.
type Hub struct {
	mu       sync.Mutex
	buf      int
	log      *slog.Logger
	watchers map[*watcher]struct{}
}

// NewHub returns a hub whose watchers buffer up to buf events; log (may be
// nil) hears about watchers that are dropped.
func NewHub(buf int, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{buf: buf, log: log, watchers: make(map[*watcher]struct{})}
}

// Add registers a watcher that is removed (and its channel closed) when ctx
// ends.
func (h *Hub) Add(ctx context.Context, prefix string) <-chan store.Event {
	w := &watcher{prefix: prefix, ch: make(chan store.Event, h.buf)}
	h.mu.Lock()
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	// Set stop after registration; remove tolerates a nil stop because the
	// AfterFunc may run before the assignment below is visible to it.
	stop := context.AfterFunc(ctx, func() { h.remove(w) })
	h.mu.Lock()
	w.stop = stop
	h.mu.Unlock()
	return w.ch
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

// Publish delivers events, in order, to every watcher whose prefix matches.
// A watcher whose buffer is full is dropped. Each watcher gets its own copy
// of the values.
func (h *Hub) Publish(events []store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		for _, ev := range events {
			if !strings.HasPrefix(ev.KV.Key, w.prefix) {
				continue
			}
			ev.KV.Value = slices.Clone(ev.KV.Value)
			select {
			case w.ch <- ev:
			default:
				h.log.Warn("store watcher fell behind; disconnecting it", "prefix", w.prefix, "buffer", h.buf)
				h.dropLocked(w)
			}
			if _, ok := h.watchers[w]; !ok {
				break
			}
		}
	}
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
