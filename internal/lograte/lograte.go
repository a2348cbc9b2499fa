// Package lograte keeps log lines about events an attacker can repeat at
// will (refused connections, dropped packets, denied calls) to a few per
// interval, each saying how many it stands for. It imports nothing of
// Corral's. Its types are safe for concurrent use.
package lograte

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// DefaultInterval is a Counter's interval when none is set.
const DefaultInterval = 10 * time.Second

// Counter counts events and reports them at most once per Interval: the
// first event is reported at once, later ones in the next report with the
// count since the previous one. The zero value is ready to use.
type Counter struct {
	// Interval between reports; zero means DefaultInterval. Set it before
	// the first Add.
	Interval time.Duration

	n    atomic.Int64
	once sync.Once
	rl   rate.Sometimes
}

// Add counts k events and, when a report is due, calls report with the
// count since the previous report (k included). report runs on the
// caller's goroutine, at most one at a time.
func (c *Counter) Add(k int64, report func(since int64)) {
	c.n.Add(k)
	c.once.Do(func() {
		c.rl = rate.Sometimes{First: 1, Interval: cmp.Or(max(c.Interval, 0), DefaultInterval)}
	})
	c.rl.Do(func() { report(c.n.Swap(0)) })
}

// Gate lets a burst of lines through, then one per interval, and counts
// the ones it held back.
type Gate struct {
	mu      sync.Mutex
	lim     *rate.Limiter
	dropped int
}

// NewGate returns a Gate that allows burst lines at once and one more
// every interval.
func NewGate(every time.Duration, burst int) *Gate {
	return &Gate{lim: rate.NewLimiter(rate.Every(every), burst)}
}

// Allow reports whether a line may be written now and, when it may, how
// many were held back since the last one allowed.
func (g *Gate) Allow() (suppressed int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.lim.Allow() {
		g.dropped++
		return 0, false
	}
	d := g.dropped
	g.dropped = 0
	return d, true
}

// Kinds writes at most one line of each kind per interval, where a kind
// is one call site's message (so its table is bounded by the caller's
// list of kinds): a packet storm (spoofed MACs, garbage, a pool run dry)
// costs one line a minute, and the next line of a kind says how many were
// suppressed since the last.
type Kinds struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time
	mu       sync.Mutex
	kinds    map[string]*kindState
}

type kindState struct {
	last       time.Time
	suppressed int
}

// NewKinds returns a Kinds writing to log at most once per interval a
// kind, on the clock now.
func NewKinds(log *slog.Logger, interval time.Duration, now func() time.Time) *Kinds {
	return &Kinds{log: log, interval: interval, now: now, kinds: map[string]*kindState{}}
}

// Log writes msg with args at level unless a line of kind was written
// less than an interval ago; then it only counts it. A written line gets
// "suppressed" (how many of its kind were not written before it) when
// that is not zero.
func (l *Kinds) Log(level slog.Level, kind, msg string, args ...any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	now := l.now()
	l.mu.Lock()
	st := l.kinds[kind]
	if st == nil {
		st = &kindState{}
		l.kinds[kind] = st
	}
	if !st.last.IsZero() && now.Sub(st.last) < l.interval {
		st.suppressed++
		l.mu.Unlock()
		return
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

// Warn is Log at warning level.
func (l *Kinds) Warn(kind, msg string, args ...any) { l.Log(slog.LevelWarn, kind, msg, args...) }

// Info is Log at info level.
func (l *Kinds) Info(kind, msg string, args ...any) { l.Log(slog.LevelInfo, kind, msg, args...) }
