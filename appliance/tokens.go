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
	t := time.NewTicker(tokenPurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			n, err := s.tokens.PurgeExpired(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("expired token purge failed", "err", err)
			case n > 0:
				s.log.Info("expired tokens purged", "count", n)
			}
		}
	}
}
