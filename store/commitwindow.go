package store

import "context"

type commitWindowKey struct{}

// WithCommitWindow returns a context whose writes may wait a moment for a
// backend that batches its flushes (store/bolt's Options.CommitWindow) to
// share one flush with the writes that arrive meanwhile. It is for writes
// driven by the network at a rate, such as DHCP leases; a write is still
// answered only once it is durable. Backends without such a window ignore
// it.
func WithCommitWindow(ctx context.Context) context.Context {
	return context.WithValue(ctx, commitWindowKey{}, true)
}

// MayWaitForCommit reports whether ctx's writes may wait for a commit
// window (WithCommitWindow).
func MayWaitForCommit(ctx context.Context) bool { return ctx.Value(commitWindowKey{}) != nil }
