// Package fakeclock is a settable clock for tests: its Now is what
// components take as their Config.Now. Safe for concurrent use. Test
// support only; it imports nothing of Corral's.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a settable time source.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock reading t.
func New(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
