package mem

import (
	"context"
	"slices"
	"strings"

	"github.com/corralhq/corral/store"
)

// ListPage implements store.Pager: it reads only the page's records.
func (s *Store) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, 0, store.ErrClosed
	}
	from := max(prefix, startAfter)
	i, found := slices.BinarySearch(s.keys, from)
	if found && from == startAfter {
		i++
	}
	out := []store.KV{}
	for ; i < len(s.keys) && len(out) < limit && strings.HasPrefix(s.keys[i], prefix); i++ {
		k := s.keys[i]
		r := s.recs[k]
		out = append(out, store.KV{Key: k, Value: slices.Clone(r.value), Revision: r.rev})
	}
	return out, s.rev, nil
}
