package store

import (
	"context"
	"math"
	"slices"
	"strings"
)

// Pager is implemented by stores that can read a bounded range of a
// prefix, so that a paged list of 50,000 records reads one page and not
// every record (store/bolt, store/mem and store/etcd implement it).
//
// ListPage returns at most limit records whose key starts with prefix and
// sorts after startAfter ("" = from the first), in key order, and the
// store-wide revision the page was read at (as ListRevision's). A limit
// of 0 or less is refused by ListPageOf; implementations may assume
// limit > 0. Successive pages are each consistent but not one snapshot:
// a record present from the first page to the last is returned exactly
// once, a record created or deleted meanwhile at most once.
type Pager interface {
	ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]KV, int64, error)
}

// AsPager returns s, or the first store s wraps (through Unwrapper), that
// implements Pager.
func AsPager(s Store) (Pager, bool) {
	for i := 0; s != nil && i < 16; i++ {
		if p, ok := s.(Pager); ok {
			return p, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			return nil, false
		}
		s = u.Unwrap()
	}
	return nil, false
}

// ListPageOf is Pager.ListPage on any store: through its Pager when it
// (or a store it wraps) has one, else by List (and ListRevision for the
// revision, when it has one) cut to the page. limit must be positive.
func ListPageOf(ctx context.Context, s Store, prefix, startAfter string, limit int) ([]KV, int64, error) {
	if limit <= 0 {
		limit = 1
	}
	if p, ok := AsPager(s); ok {
		return p.ListPage(ctx, prefix, startAfter, limit)
	}
	var (
		kvs []KV
		rev int64
		err error
	)
	if h, ok := AsHistoryWatcher(s); ok {
		kvs, rev, err = h.ListRevision(ctx, prefix)
	} else {
		kvs, err = s.List(ctx, prefix)
	}
	if err != nil {
		return nil, 0, err
	}
	return PageOf(kvs, startAfter, limit), rev, nil
}

// PageOf cuts the records after startAfter, at most limit of them, from
// kvs sorted by key; the result shares kvs' backing array.
func PageOf(kvs []KV, startAfter string, limit int) []KV {
	i := 0
	if startAfter != "" {
		i, _ = slices.BinarySearchFunc(kvs, startAfter, func(kv KV, k string) int { return strings.Compare(kv.Key, k) })
		if i < len(kvs) && kvs[i].Key == startAfter {
			i++
		}
	}
	return kvs[i:min(i+limit, len(kvs))]
}

// ScanPages calls fn with the records under prefix in key order, at most
// limit at a time (ListPageOf), until they end or fn returns an error,
// which it returns with the first page's revision (so fn may stop a scan
// early with an error of its own). It holds one page at a time, so a scan of 50,000
// records keeps no more than fn does. It returns the revision the first
// page was read at: every record fn sees is at least that new, so a watch
// from it (HistoryWatcher.WatchFrom) misses no change made during the
// scan. A store without a Pager is read in one List (a page per List
// would read the prefix once a page). fn may keep the records it is
// given.
func ScanPages(ctx context.Context, s Store, prefix string, limit int, fn func([]KV) error) (int64, error) {
	if _, ok := AsPager(s); !ok {
		limit = math.MaxInt32
	}
	limit = max(limit, 1)
	var first int64
	after := ""
	for {
		kvs, rev, err := ListPageOf(ctx, s, prefix, after, limit)
		if err != nil {
			return 0, err
		}
		if after == "" {
			first = rev
		}
		if len(kvs) > 0 {
			if err := fn(kvs); err != nil {
				return first, err
			}
		}
		if len(kvs) < limit {
			return first, nil
		}
		after = kvs[len(kvs)-1].Key
	}
}
