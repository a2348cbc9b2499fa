package etcd

import (
	"context"

	"github.com/corralhq/corral/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ListPage implements store.Pager: one ranged Get of at most limit keys.
func (s *Store) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	full := s.prefix + prefix
	from := full
	if startAfter != "" && s.prefix+startAfter >= full {
		from = s.prefix + startAfter + "\x00"
	}
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(full)), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, 0, s.wrap(ctx, "list page", prefix, err)
	}
	out := make([]store.KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, kvOf(s.prefix, kv))
	}
	return out, resp.Header.Revision, nil
}
