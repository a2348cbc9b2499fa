// Package watchstream is the one implementation of the corral.watch.v1
// contract that every Watch RPC uses: an initial list and SYNCED (or a
// resume from a revision), then live changes from the store's resumable
// watch, through a bounded buffer per watcher, under a cap on concurrent
// watchers per appliance.
//
// It owns the stream's semantics (ADDED / MODIFIED / DELETED / SYNCED, an
// object leaving a filter sent as DELETED, the revisions a client resumes
// from) and the cut of a watcher that falls behind; callers own the
// decoding of their records and the gRPC edge (apierr.ToStatus maps the
// errors: ErrCompacted → OUT_OF_RANGE, a watcher cut or refused →
// RESOURCE_EXHAUSTED). The store's own watch goroutine never waits for a
// client: a pump goroutine moves events from the store into the watcher's
// buffer without blocking, and the RPC's goroutine sends from it.
//
// It imports the store contract, the watch API's event types and the error
// vocabulary; nothing of a service.
//
// A Watch RPC is a few lines (inventory's WatchMachines, simplified):
//
//	func (s *MachineServer) WatchMachines(req *inventoryv1.WatchMachinesRequest, stream inventoryv1.MachineService_WatchMachinesServer) error {
//		err := watchstream.Run(stream.Context(), watchstream.Config[*inventoryv1.Machine]{
//			Name:         "machines",
//			Store:        s.Inv.Store(),
//			Prefix:       "/inventory/machines/",
//			FromRevision: req.GetFromRevision(),
//			Decode: func(kv store.KV) (*inventoryv1.Machine, bool, error) {
//				m := &inventoryv1.Machine{}
//				return m, true, record.Unmarshal(kv.Value, m)
//			},
//			Deleted: func(key string) (*inventoryv1.Machine, bool) {
//				return &inventoryv1.Machine{Name: strings.TrimPrefix(key, "/inventory/machines/")}, true
//			},
//			Match: func(m *inventoryv1.Machine) bool { return req.GetState() == 0 || m.GetState() == req.GetState() },
//		}, func(ev watchstream.Event[*inventoryv1.Machine]) error {
//			return stream.Send(&inventoryv1.MachineEvent{Type: ev.Type, Revision: ev.Revision, Machine: ev.Object})
//		})
//		return apierr.ToStatus(err)
//	}
package watchstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/store"
)

// Defaults for Config and Limiter.
const (
	// DefaultBuffer is how many events may wait for one watcher's client
	// before the watcher is cut.
	DefaultBuffer = 1024
	// DefaultMaxWatchers is the Default limiter's cap on concurrent
	// watchers of one appliance.
	DefaultMaxWatchers = 1000
	// DefaultMaxTracked bounds the keys one watcher remembers (to tell
	// ADDED from MODIFIED and to send DELETED when an object leaves its
	// filter). Past it the watcher answers conservatively: MODIFIED for a
	// key it does not know, DELETED for one that may have left.
	DefaultMaxTracked = 100_000
	// maxResubscribes is how many times in a row the pump re-opens a
	// store watch that the store ended (the store drops a watcher whose
	// own buffer overflows) before it gives up.
	maxResubscribes = 3
)

// Limiter caps the number of concurrent watchers. It is safe for
// concurrent use; the zero value refuses every watcher.
type Limiter struct {
	max    int64
	active atomic.Int64
}

// NewLimiter returns a limiter that admits at most limit watchers at once
// (limit <= 0: DefaultMaxWatchers).
func NewLimiter(limit int) *Limiter {
	if limit <= 0 {
		limit = DefaultMaxWatchers
	}
	return &Limiter{max: int64(limit)}
}

// Default is the appliance-wide limiter used when Config.Limiter is nil.
var Default = NewLimiter(DefaultMaxWatchers)

// SetMax changes the cap (limit <= 0: DefaultMaxWatchers). Watchers already
// admitted stay.
func (l *Limiter) SetMax(limit int) {
	if limit <= 0 {
		limit = DefaultMaxWatchers
	}
	atomic.StoreInt64(&l.max, int64(limit))
}

// Active is the number of watchers running now.
func (l *Limiter) Active() int { return int(l.active.Load()) }

func (l *Limiter) acquire(name string) (func(), error) {
	limit := atomic.LoadInt64(&l.max)
	if n := l.active.Add(1); n > limit {
		l.active.Add(-1)
		return nil, apierr.Exhaustedf("watch %s: this appliance already serves %d watchers, its limit; close one or try again later", name, limit)
	}
	var once sync.Once
	return func() { once.Do(func() { l.active.Add(-1) }) }, nil
}

// Event is one event of a watch stream.
type Event[T any] struct {
	Type watchv1.EventType
	// Revision is the store revision of the change; for the initial
	// list's ADDED events it is the object's last change, and for SYNCED
	// the revision the list was read at. A client resumes from the
	// revision of SYNCED or of any later event it received.
	Revision int64
	// Object is the zero value for SYNCED.
	Object T
}

// Config describes one watch.
type Config[T any] struct {
	// Name says what is watched, in error messages ("machines").
	Name string
	// Store is the store; it (or a store it wraps) must implement
	// store.HistoryWatcher.
	Store store.Store
	// Prefix selects the records.
	Prefix string
	// Decode turns a record into the object sent. ok=false skips the
	// record (an index key, another machine's entry); an error skips it
	// too and is logged (rate-limited).
	Decode func(kv store.KV) (obj T, ok bool, err error)
	// Deleted makes the object sent for a deleted key (usually just its
	// name); ok=false sends nothing for deletes of that key.
	Deleted func(key string) (obj T, ok bool)
	// Match, when set, filters decoded objects: an object that stops
	// matching is sent as DELETED (with its new state), one that starts
	// matching as ADDED.
	Match func(obj T) bool
	// WriteOnce says records are created once and never rewritten (a
	// timeline's entries): every put is ADDED and no key is remembered.
	// Match must be nil.
	WriteOnce bool
	// Initial, when set, trims the initial list (in key order, matching
	// objects only) before it is sent, e.g. to the newest N entries.
	Initial func(objs []T) []T
	// FromRevision: 0 lists first; R > 0 resumes after R (see the
	// package corral.watch.v1 contract).
	FromRevision int64
	// Buffer is the per-watcher buffer (default DefaultBuffer).
	Buffer int
	// MaxTracked bounds the keys remembered (default DefaultMaxTracked).
	MaxTracked int
	// Limiter caps concurrent watchers (default: Default).
	Limiter *Limiter
	// Logger hears about undecodable records (default: discard).
	Logger *slog.Logger
}

var decodeFailures lograte.Counter

// Run serves one watch until ctx ends, send fails, or the watcher is cut;
// it blocks for the life of the stream and calls send from its own
// goroutine only, one event at a time. It returns ctx's error when ctx
// ends, send's error when send fails, and otherwise an apierr error whose
// text tells the client what to do: class ErrOutOfRange (wrapping
// store.ErrCompacted) when FromRevision is no longer kept or is in the
// future, ErrExhausted when the appliance is at its watcher cap or the
// client fell more than Buffer events behind (with the revision to resume
// from), ErrUnavailable when the store ended the watch, ErrInvalid for a
// negative FromRevision. No goroutine of the watch outlives Run.
func Run[T any](ctx context.Context, cfg Config[T], send func(Event[T]) error) error {
	if cfg.Name == "" {
		cfg.Name = cfg.Prefix
	}
	if cfg.FromRevision < 0 {
		return apierr.Invalidf("watch %s: from_revision %d is negative", cfg.Name, cfg.FromRevision)
	}
	if cfg.Store == nil || cfg.Decode == nil || (cfg.WriteOnce && cfg.Match != nil) {
		return fmt.Errorf("watchstream: watch %s: Config.Store and Config.Decode are required, and WriteOnce takes no Match", cfg.Name)
	}
	hw, ok := store.AsHistoryWatcher(cfg.Store)
	if !ok {
		return apierr.Unavailablef("watch %s: this appliance's store (%T) cannot serve resumable watches", cfg.Name, cfg.Store)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = DefaultMaxTracked
	}
	if cfg.Limiter == nil {
		cfg.Limiter = Default
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	release, err := cfg.Limiter.acquire(cfg.Name)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	w := &watcher[T]{cfg: cfg, hw: hw, tracked: map[string]bool{}, complete: true}
	var initial []Event[T]
	after := cfg.FromRevision
	if after == 0 {
		kvs, rev, err := hw.ListRevision(ctx, cfg.Prefix)
		if err != nil {
			return fmt.Errorf("watch %s: initial list: %w", cfg.Name, err)
		}
		var objs []T
		var revs []int64
		for _, kv := range kvs {
			obj, ok := w.decode(kv)
			if !ok {
				continue
			}
			in := cfg.Match == nil || cfg.Match(obj)
			if !cfg.WriteOnce {
				w.track(kv.Key, in)
			}
			if in {
				objs = append(objs, obj)
				revs = append(revs, kv.Revision)
			}
		}
		if cfg.Initial != nil {
			// Initial may reorder or trim: revisions then say only that
			// the object is no newer than the list.
			trimmed := cfg.Initial(objs)
			if len(trimmed) != len(objs) {
				revs = nil
			}
			objs = trimmed
		}
		for i, obj := range objs {
			r := rev
			if revs != nil {
				r = revs[i]
			}
			initial = append(initial, Event[T]{Type: watchv1.EventType_ADDED, Revision: r, Object: obj})
		}
		after = rev
	} else {
		// The client knows objects we have not seen: nothing is known
		// to be absent.
		w.complete = false
		// The history up to now is a backlog the client asked for, not
		// a sign of a slow client: the pump waits for the client while
		// it delivers it (the store's channel holds it already).
		cur, err := hw.Revision(ctx)
		if err != nil {
			return fmt.Errorf("watch %s: %w", cfg.Name, err)
		}
		w.catchUp = cur
	}
	ch, err := hw.WatchFrom(ctx, cfg.Prefix, after)
	if err != nil {
		if errors.Is(err, store.ErrCompacted) {
			return fmt.Errorf("watch %s: %w", cfg.Name, err)
		}
		return fmt.Errorf("watch %s from revision %d: %w", cfg.Name, after, err)
	}
	w.buf = make(chan Event[T], cfg.Buffer)
	w.cut = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.pump(ctx, ch, after)
	}()
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: the pump ends with ctx

	lastSent := after
	synced := cfg.FromRevision != 0
	fellBehind := func() error {
		if err := w.cutErr; err != nil {
			if errors.Is(err, errOverflow) {
				if !synced {
					return apierr.Exhaustedf("watch %s: watcher fell behind during its initial list (%d events waiting); re-list with from_revision 0", cfg.Name, cfg.Buffer)
				}
				// Resume before the revision that did not fit: its other
				// events (one transaction's, or one group commit's) may
				// have gone out already and come again, none is lost.
				resume := lastSent
				if w.cutRev > 0 {
					resume = min(resume, w.cutRev-1)
				}
				return apierr.Exhaustedf("watch %s: watcher fell behind at revision %d (%d events waiting for it); resume with from_revision %d", cfg.Name, lastSent, cfg.Buffer, resume)
			}
			return err
		}
		return nil
	}
	deliver := func(ev Event[T]) error {
		select {
		case <-w.cut:
			return w.errAt(fellBehind(), lastSent)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if err := send(ev); err != nil {
			return err
		}
		if synced && ev.Revision > lastSent {
			lastSent = ev.Revision
		}
		return nil
	}
	for _, ev := range initial {
		if err := deliver(ev); err != nil {
			return err
		}
	}
	if !synced {
		if err := deliver(Event[T]{Type: watchv1.EventType_SYNCED, Revision: after}); err != nil {
			return err
		}
		synced = true
	}
	for {
		select {
		case <-w.cut:
			return w.errAt(fellBehind(), lastSent)
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-w.buf:
			if err := deliver(ev); err != nil {
				return err
			}
		}
	}
}

// errOverflow marks a cut for a full buffer.
var errOverflow = errors.New("watcher buffer full")

// watcher is the state of one Run.
type watcher[T any] struct {
	cfg Config[T]
	hw  store.HistoryWatcher
	// tracked: key → in the filter (only the pump uses it once Run has
	// started it). complete: every key absent from tracked is absent
	// from the watcher's view.
	tracked  map[string]bool
	complete bool
	// catchUp: events at or below it are the resumed history, which
	// the pump delivers without cutting the watcher.
	catchUp int64

	buf    chan Event[T]
	cut    chan struct{} // closed by the pump when it stops early
	cutErr error         // set before cut is closed
	cutRev int64         // the revision that overflowed the buffer; set before cut is closed
}

// errAt returns err, or an Unavailable naming rev when the pump stopped
// without one.
func (w *watcher[T]) errAt(err error, rev int64) error {
	if err != nil {
		return err
	}
	return apierr.Unavailablef("watch %s: ended at revision %d; resume with from_revision %d", w.cfg.Name, rev, rev)
}

func (w *watcher[T]) decode(kv store.KV) (T, bool) {
	obj, ok, err := w.cfg.Decode(kv)
	if err != nil {
		decodeFailures.Add(1, func(n int64) {
			w.cfg.Logger.Warn("watch: record cannot be decoded; skipped", "watch", w.cfg.Name, "key", kv.Key, "err", err, "skipped_since_last_log", n)
		})
		return obj, false
	}
	return obj, ok
}

// track remembers whether key is in the filter, within MaxTracked.
func (w *watcher[T]) track(key string, in bool) {
	if _, ok := w.tracked[key]; ok || len(w.tracked) < w.cfg.MaxTracked {
		w.tracked[key] = in
		return
	}
	w.complete = false
}

// stop ends the pump early with err.
func (w *watcher[T]) stop(err error) {
	w.cutErr = err
	close(w.cut)
}

// pump moves store events into the watcher's buffer without ever
// blocking, re-opening the store watch (from the last revision it saw)
// when the store ends it, and stops at the first full buffer.
func (w *watcher[T]) pump(ctx context.Context, ch <-chan store.Event, last int64) {
	tries := 0
	for {
		for sev := range ch {
			tries = 0
			last = sev.KV.Revision
			ev, ok := w.convert(sev)
			if !ok {
				continue
			}
			if ev.Revision <= w.catchUp {
				select {
				case w.buf <- ev:
				case <-ctx.Done():
					return
				}
				continue
			}
			select {
			case w.buf <- ev:
			default:
				w.cutRev = ev.Revision
				w.stop(errOverflow)
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if tries++; tries > maxResubscribes {
			w.stop(apierr.Unavailablef("watch %s: the store keeps ending the watch at revision %d; resume with from_revision %d", w.cfg.Name, last, last))
			return
		}
		var err error
		ch, err = w.hw.WatchFrom(ctx, w.cfg.Prefix, last)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, store.ErrCompacted) {
				w.stop(fmt.Errorf("watch %s: %w", w.cfg.Name, err))
			} else {
				w.stop(apierr.Unavailablef("watch %s: the store ended the watch at revision %d (%v); resume with from_revision %d", w.cfg.Name, last, err, last))
			}
			return
		}
	}
}

// convert turns a store event into a stream event (ok=false: none).
func (w *watcher[T]) convert(sev store.Event) (Event[T], bool) {
	key := sev.KV.Key
	was, known := w.tracked[key]
	if sev.Type == store.EventDelete {
		delete(w.tracked, key)
		if w.cfg.Deleted == nil || (known && !was) || (!known && w.complete) {
			return Event[T]{}, false
		}
		obj, ok := w.cfg.Deleted(key)
		return Event[T]{Type: watchv1.EventType_DELETED, Revision: sev.KV.Revision, Object: obj}, ok
	}
	obj, ok := w.decode(sev.KV)
	if !ok {
		return Event[T]{}, false
	}
	if w.cfg.WriteOnce {
		return Event[T]{Type: watchv1.EventType_ADDED, Revision: sev.KV.Revision, Object: obj}, true
	}
	in := w.cfg.Match == nil || w.cfg.Match(obj)
	w.track(key, in)
	ev := Event[T]{Revision: sev.KV.Revision, Object: obj}
	switch {
	case in && known && was:
		ev.Type = watchv1.EventType_MODIFIED
	case in && (known || w.complete):
		ev.Type = watchv1.EventType_ADDED
	case in:
		ev.Type = watchv1.EventType_MODIFIED
	case known && was, !known && !w.complete:
		ev.Type = watchv1.EventType_DELETED
	default:
		return Event[T]{}, false
	}
	return ev, true
}
