package dhcp

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Kinds of rate-limited log lines. Each is one call site's message; the
// limiter keeps one state per kind, so its map is bounded by this list.
const (
	logMalformed      = "malformed"
	logOverloaded     = "overloaded"
	logNoOffer        = "no-offer"
	logNotSent        = "not-sent"
	logInventory      = "inventory"
	logDiscoveredCap  = "discovered-cap"
	logDecline        = "decline"
	logDeclineIgnored = "decline-ignored"
	logUnknownReboot  = "init-reboot-unknown"
	logNak            = "nak"
	logIgnoredRelay   = "ignored-relay"
	logLeaseNotStored = "lease-not-stored"
	logStoreBusy      = "store-busy"
)

// logLimiter writes at most one line per kind per interval: a packet
// storm (spoofed MACs, garbage, a pool run dry) costs one line a minute,
// and the next line of a kind says how many were suppressed since the
// last one. Safe for concurrent use.
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

// Log writes msg with args at level unless a line of kind was written
// less than an interval ago; then it only counts it. A written line gets
// "suppressed" (how many of its kind were not written before it) when
// that is not zero.
func (l *logLimiter) Log(level slog.Level, kind, msg string, args ...any) {
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

func (l *logLimiter) Warn(kind, msg string, args ...any) { l.Log(slog.LevelWarn, kind, msg, args...) }
func (l *logLimiter) Info(kind, msg string, args ...any) { l.Log(slog.LevelInfo, kind, msg, args...) }
