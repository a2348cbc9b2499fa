package dhcp6

import (
	"log/slog"
	"time"

	"github.com/corralhq/corral/internal/keyrate"
	"github.com/corralhq/corral/internal/lograte"
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
	logRelay      = "relay-refused"
)

// logLimiter writes at most one line per kind per interval; the next line
// of a kind says how many were suppressed.
type logLimiter = lograte.Kinds

func newLogLimiter(log *slog.Logger, interval time.Duration, now func() time.Time) *logLimiter {
	return lograte.NewKinds(log, interval, now)
}

// budgets are per-client token buckets: rate packets a second, burst at
// most, for at most max clients (past it the least recently seen is
// forgotten and starts again with a full bucket, so forgetting never
// refuses anyone wrongly; a storm of new DUIDs is bounded by MaxInFlight).
type budgets struct {
	t   *keyrate.Table
	now func() time.Time
}

func newBudgets(rate float64, burst float64, maxTracked int, now func() time.Time) *budgets {
	return &budgets{t: keyrate.New(rate, max(int(burst), 1), maxTracked), now: now}
}

// take spends one packet of key's budget; false when it has none left.
func (b *budgets) take(key string) bool { return b.t.Allow(key, b.now()) }
