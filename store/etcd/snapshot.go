package etcd

import (
	"context"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/corralhq/corral/store"
)

var _ store.Snapshotter = (*Store)(nil)

// Snapshot implements store.Snapshotter: every record under the store's
// prefix but the leader election's (lease-bound keys, not records), read
// in pages all pinned to the revision of the first request.
// The pages are read back to back before Snapshot returns, so the window in
// which a compaction could overtake them is short; if one does, the error
// is a precondition failure and the caller simply tries again.
func (s *Store) Snapshot(ctx context.Context) (int64, []store.KV, error) {
	if err := s.enter(); err != nil {
		return 0, nil, err
	}
	end := clientv3.GetPrefixRangeEnd(s.prefix)
	out := []store.KV{}
	from, rev := s.prefix, int64(0)
	for {
		rctx, cancel := s.reqCtx(ctx)
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(rctx, from, opts...)
		cancel()
		if err != nil {
			return 0, nil, s.wrap(ctx, "snapshot", s.prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if r := kvOf(s.prefix, kv); !strings.HasPrefix(r.Key, electionKey+"/") {
				out = append(out, r)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, out, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
