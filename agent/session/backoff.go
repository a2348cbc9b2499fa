package session

import (
	"time"

	"github.com/cenkalti/backoff/v5"
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
	// The exponential part without jitter up to attempt, then one
	// jittered pause: the library keeps its interval unexported.
	e := backoff.ExponentialBackOff{InitialInterval: min(initial, maxD), Multiplier: 2, MaxInterval: maxD}
	for range attempt {
		e.NextBackOff()
	}
	e.RandomizationFactor = jitter
	return e.NextBackOff()
}
