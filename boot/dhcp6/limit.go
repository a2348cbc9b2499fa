package dhcp6

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Kinds of rate-limited log lines, one per call site, so the limiter's
// map is bounded by this list.
const (
	logMalformed  = "malformed"
	logOverloaded = "overloaded"
	logLimited    = "client-over-budget"
	logNoAddrs    = "no-addrs"
	logNotSent    = "not-sent"
	logInventory  = "inventory"
	logStore      = "lease-not-stored"
	logDecline    = "decline"
)

// logLimiter writes at most one line per kind per interval; the next line
// of a kind says how many were suppressed. Safe for concurrent use.
type logLimiter struct {
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

func newLogLimiter(log *slog.Logger, interval time.Duration, now func() time.Time) *logLimiter {
	return &logLimiter{log: log, interval: interval, now: now, kinds: map[string]*kindState{}}
}

// Warn logs msg unless a line of kind was written less than an interval
// ago; then it only counts it.
func (l *logLimiter) Warn(kind, msg string, args ...any) {
	if !l.log.Enabled(context.Background(), slog.LevelWarn) {
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
	l.log.Warn(msg, args...)
}

// budgets are per-client token buckets: rate packets a second, burst at
// most. The table holds at most max clients; when full it is cleared (a
// forgotten client starts with a full bucket, so clearing never refuses
// anyone wrongly; a storm of new DUIDs is bounded by MaxInFlight).
type budgets struct {
	rate, burst float64
	max         int
	now         func() time.Time
	mu          sync.Mutex
	m           map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newBudgets(rate, burst float64, maxTracked int, now func() time.Time) *budgets {
	return &budgets{rate: rate, burst: burst, max: maxTracked, now: now, m: map[string]*bucket{}}
}

// take spends one packet of key's budget; false when it has none left.
func (b *budgets) take(key string) bool {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.m[key]
	if k == nil {
		if len(b.m) >= b.max {
			clear(b.m)
		}
		k = &bucket{tokens: b.burst, at: now}
		b.m[key] = k
	}
	if d := now.Sub(k.at).Seconds(); d > 0 {
		k.tokens = min(b.burst, k.tokens+d*b.rate)
		k.at = now
	}
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}
