package bolt

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/corralhq/corral/store"
)

// ListPage implements store.Pager: one read transaction seeks to the
// page's first key and reads at most limit records, merged with the
// writes of the commit window not yet in bbolt, at the revision
// ListRevision would report.
func (s *Store) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	defer s.closeMu.RUnlock()

	tx, ov, ovRev, err := s.beginRead(prefix)
	if err != nil {
		return nil, 0, fmt.Errorf("bolt: list page %q: %w", prefix, err)
	}
	defer func() { _ = tx.Rollback() }()
	b := tx.Bucket(recordsBucket)
	meta := tx.Bucket(metaBucket)
	if b == nil || meta == nil {
		return nil, 0, fmt.Errorf("bolt: list page %q: %w", prefix, corruptf("store buckets missing"))
	}
	cur, err := decodeRev(meta.Get(revKey))
	if err != nil {
		return nil, 0, fmt.Errorf("bolt: list page %q: %w", prefix, err)
	}
	// The overlay's keys after startAfter, in order, merged with the
	// cursor's: an overlay entry replaces (or deletes) bbolt's record.
	var ovKeys []string
	for _, k := range slices.Sorted(maps.Keys(ov)) {
		if k > startAfter {
			ovKeys = append(ovKeys, k)
		}
	}
	c := b.Cursor()
	from := max(prefix, startAfter)
	k, raw := c.Seek([]byte(from))
	if k != nil && string(k) == startAfter {
		k, raw = c.Next()
	}
	out := []store.KV{}
	for len(out) < limit {
		haveBolt := k != nil && bytes.HasPrefix(k, []byte(prefix))
		if !haveBolt && len(ovKeys) == 0 {
			break
		}
		if len(ovKeys) > 0 && (!haveBolt || ovKeys[0] <= string(k)) {
			ok := ovKeys[0]
			ovKeys = ovKeys[1:]
			if haveBolt && ok == string(k) {
				k, raw = c.Next()
			}
			if e := ov[ok]; !e.deleted {
				out = append(out, store.KV{Key: ok, Value: append([]byte{}, e.value...), Revision: e.rev})
			}
			continue
		}
		rev, val, err := decodeRecord(raw)
		if err != nil {
			return nil, 0, fmt.Errorf("bolt: list page %q: key %q: %w", prefix, k, err)
		}
		out = append(out, store.KV{Key: string(k), Value: append([]byte{}, val...), Revision: rev})
		k, raw = c.Next()
	}
	return out, max(cur, ovRev), nil
}
