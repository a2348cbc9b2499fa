// Package lograte keeps log lines about events an attacker can repeat at
// will (refused connections, dropped packets, denied calls) to a few per
// interval, each saying how many it stands for. It imports nothing of
// Corral's. Its types are safe for concurrent use.
package lograte

import (
	"cmp"
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
