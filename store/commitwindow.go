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

type localReadsKey struct{}

// WithLocalReads returns a context whose point reads may be answered by
// whichever replica the backend reaches first, without asking the
// cluster's leader whether it is current (etcd's serializable reads): a
// few milliseconds stale, at a fraction of the cost. It is for the reads
// of network-driven work at a rate whose decisions are made safe by the
// compare-and-swap of the write that follows them (a stale read loses that
// compare and is read again), such as DHCP's lookups of a client's
// machine and lease. Backends with one copy ignore it.
func WithLocalReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, localReadsKey{}, true)
}

// WithFreshReads undoes WithLocalReads for ctx: its reads are current.
// Work reading locally confirms on a fresh read what it would refuse or
// remember: a stale read that leads to a write loses that write's
// compare-and-swap, but one that leads to a refusal (an address "taken",
// a RELEASE "not the holder's") or into a cache is never corrected.
func WithFreshReads(ctx context.Context) context.Context {
	if !LocalReads(ctx) {
		return ctx
	}
	return context.WithValue(ctx, localReadsKey{}, nil)
}

// LocalReads reports whether ctx's reads may be served locally
// (WithLocalReads).
func LocalReads(ctx context.Context) bool { return ctx.Value(localReadsKey{}) != nil }
