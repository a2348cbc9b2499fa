package store

import "context"

// Snapshotter is implemented by stores that can read every record they hold
// as of one revision: the online backup (package appliance) uses it so that a
// backup is one consistent picture even while writes go on.
//
// Snapshot returns the store-wide revision the records were read at and
// every record, in key order (KV.Revision is each record's own last write,
// never above rev). The records are copied out before Snapshot returns, so
// no transaction or lock is held while the caller uses them, and writers are
// never blocked by a slow reader of the result. It costs memory in
// proportion to the store's size. Errors are the store's own (ErrClosed, a
// context error, or for etcd a compacted revision as a precondition).
type Snapshotter interface {
	Snapshot(ctx context.Context) (rev int64, kvs []KV, err error)
}

// AsSnapshotter returns s, or the first store s wraps (through Unwrapper),
// that implements Snapshotter.
func AsSnapshotter(s Store) (Snapshotter, bool) {
	for i := 0; s != nil && i < 16; i++ {
		if sn, ok := s.(Snapshotter); ok {
			return sn, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			return nil, false
		}
		s = u.Unwrap()
	}
	return nil, false
}
