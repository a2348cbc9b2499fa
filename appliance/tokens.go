package appliance

import (
	"context"
	"time"
)

// tokenPurgeInterval is how often expired tokens (mostly per-boot agent
// tokens, one per rendered boot script) are deleted.
const tokenPurgeInterval = 10 * time.Minute

// purgeTokens deletes expired tokens until ctx ends.
func (s *Server) purgeTokens(ctx context.Context) error {
	return s.purgeEvery(ctx, tokenPurgeInterval, "expired tokens", s.tokens.PurgeExpired)
}

// purgeEvery runs purge every interval until ctx ends, logging what it
// removed ("<what> purged") and a failure ("<what> purge failed") unless
// ctx ended. It returns nil when ctx ends.
func (s *Server) purgeEvery(ctx context.Context, interval time.Duration, what string, purge func(context.Context) (int, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			n, err := purge(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn(what+" purge failed", "err", err)
			case n > 0:
				s.log.Info(what+" purged", "count", n)
			}
		}
	}
}
