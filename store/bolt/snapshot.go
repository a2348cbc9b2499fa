package bolt

import (
	"context"
	"fmt"

	"github.com/corralhq/corral/store"
)

var _ store.Snapshotter = (*Store)(nil)

// Snapshot implements store.Snapshotter: one bbolt read transaction reads
// the store revision and copies every record. The copy is made inside the
// transaction and the callers' work happens after it, because a long-held
// read transaction would stop the file from growing (bbolt remaps under
// the writer) and so stall the appliance's writes.
func (s *Store) Snapshot(ctx context.Context) (int64, []store.KV, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	if err := s.enter(); err != nil {
		return 0, nil, err
	}
	defer s.closeMu.RUnlock()

	var rev int64
	out := []store.KV{}
	tx, ov, ovRev, err := s.beginRead("")
	if err != nil {
		return 0, nil, fmt.Errorf("bolt: snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	err = func() error {
		meta, b := tx.Bucket(metaBucket), tx.Bucket(recordsBucket)
		if meta == nil || b == nil {
			return corruptf("meta or records bucket missing")
		}
		var err error
		if rev, err = decodeRev(meta.Get(revKey)); err != nil {
			return err
		}
		c := b.Cursor()
		for k, raw := c.First(); k != nil; k, raw = c.Next() {
			if len(out)%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			r, val, err := decodeRecord(raw)
			if err != nil {
				return fmt.Errorf("key %q: %w", k, err)
			}
			if r > rev {
				return corruptf("key %q has revision %d, above the store's %d", k, r, rev)
			}
			out = append(out, store.KV{Key: string(k), Value: append([]byte{}, val...), Revision: r})
		}
		return nil
	}()
	if err != nil {
		return 0, nil, fmt.Errorf("bolt: snapshot: %w", err)
	}
	out, rev = mergeOverlay(ov, ovRev, out, rev)
	return rev, out, nil
}
