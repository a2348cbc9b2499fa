package dhcp

import (
	"log/slog"
	"time"

	"github.com/corralhq/corral/internal/lograte"
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

// logLimiter is the per-kind limiter of the server's warnings.
type logLimiter = lograte.Kinds

func newLogLimiter(log *slog.Logger, interval time.Duration, now func() time.Time) *logLimiter {
	return lograte.NewKinds(log, interval, now)
}
