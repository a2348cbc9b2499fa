package session

import (
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with jitter. The zero value uses the
// defaults: 1 s initial, 60 s cap, ±20 % jitter.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	Jitter  float64 // fraction of the delay, 0..1
}

// Delay returns the wait before retry number attempt (0-based).
func (b Backoff) Delay(attempt int) time.Duration {
	initial, maxD, jitter := b.Initial, b.Max, b.Jitter
	if initial <= 0 {
		initial = time.Second
	}
	if maxD <= 0 {
		maxD = time.Minute
	}
	if jitter <= 0 || jitter > 1 {
		jitter = 0.2
	}
	d := initial
	for i := 0; i < attempt && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	f := 1 + jitter*(2*rand.Float64()-1)
	return time.Duration(float64(d) * f)
}
