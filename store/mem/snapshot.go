package mem

import (
	"context"
	"slices"

	"github.com/corralhq/corral/store"
)

var _ store.Snapshotter = (*Store)(nil)

// Snapshot implements store.Snapshotter: every record and the revision,
// copied under the read lock.
func (s *Store) Snapshot(ctx context.Context) (int64, []store.KV, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, nil, store.ErrClosed
	}
	out := make([]store.KV, 0, len(s.keys))
	for _, k := range s.keys {
		r := s.recs[k]
		out = append(out, store.KV{Key: k, Value: slices.Clone(r.value), Revision: r.rev})
	}
	return s.rev, out, nil
}
