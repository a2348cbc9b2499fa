// Package store is Corral's key-value contract: every shared record lives
// behind it and changes only by compare-and-swap on its revision.
//
// Implementations live in sub-packages: store/bolt (default, embedded, one
// file), store/mem (tests) and, later, store/etcd. The shared contract test
// suite in store/storetest is run against each of them.
//
// This package imports nothing of Corral's but the error vocabulary
// (internal/apierr, itself a leaf) and no backend; callers that need a
// backend get one from cmd wiring.
package store

import (
	"context"

	"github.com/corralhq/corral/internal/apierr"
)

// Sentinel errors. Implementations wrap them with %w; callers test them with
// errors.Is. Each is a member of an apierr class, so gRPC edges map them
// without knowing the store.
var (
	// ErrNotFound: the key does not exist (class apierr.ErrNotFound).
	ErrNotFound = apierr.New(apierr.ErrNotFound, "store: key not found")
	// ErrConflict: the compare-and-swap precondition failed; the caller
	// should re-read and retry (class apierr.ErrConflict).
	ErrConflict = apierr.New(apierr.ErrConflict, "store: revision conflict")
	// ErrClosed: the store has been closed (class apierr.ErrUnavailable).
	ErrClosed = apierr.New(apierr.ErrUnavailable, "store: closed")
	// ErrCorrupt: stored data cannot be decoded (class apierr.ErrDataLoss).
	ErrCorrupt = apierr.New(apierr.ErrDataLoss, "store: corrupt data")
	// ErrCompacted: WatchFrom was asked for changes after a revision the
	// store no longer keeps the history of, or after a revision it has not
	// reached (class apierr.ErrOutOfRange). The error's text names the
	// oldest revision still kept; the caller must re-list.
	ErrCompacted = apierr.New(apierr.ErrOutOfRange, "store: revision compacted")
	// ErrBusy: the store is saturated and refused the request before
	// sending it (store/etcd's admission); nothing was written, and the
	// caller may try again after a pause (class apierr.ErrExhausted).
	ErrBusy = apierr.New(apierr.ErrExhausted, "store: saturated")
)

// KV is one stored record. Revision is the store-wide revision at which the
// record was last written; it is never 0 for a stored record. The Value of a
// KV returned by Get, List or Watch is a copy the caller may keep and modify.
type KV struct {
	Key      string
	Value    []byte
	Revision int64
}

// EventType says what happened to a key.
type EventType int

const (
	// EventPut is a key created or given a new value.
	EventPut EventType = iota + 1
	// EventDelete is a key deleted.
	EventDelete
)

// Event is one change observed through Watch. For EventDelete, Value is nil
// and Revision is the revision of the delete.
type Event struct {
	Type EventType
	KV   KV
}

// Store is the contract. All methods are safe for concurrent use.
//
// Revisions are store-wide and strictly increasing: every successful Put,
// Delete or writing Txn gets a revision greater than any before it (the
// writes of one Txn share theirs), and that revision survives a restart.
type Store interface {
	// Get returns the record at key, or ErrNotFound.
	Get(ctx context.Context, key string) (KV, error)

	// List returns every record whose key starts with prefix, in key order.
	// An empty result is an empty slice and no error.
	List(ctx context.Context, prefix string) ([]KV, error)

	// Put writes value at key if the record's current revision equals rev.
	// rev == 0 means "the key must not exist" (create); a non-zero rev for
	// a key that does not exist is a conflict. It returns the new
	// revision, or ErrConflict when the precondition fails. The write is
	// durable when Put returns nil. Put does not retain value.
	Put(ctx context.Context, key string, value []byte, rev int64) (int64, error)

	// Delete removes key if its current revision equals rev. It returns
	// ErrNotFound when the key is absent and ErrConflict when the revision
	// differs. The delete is durable when Delete returns nil.
	Delete(ctx context.Context, key string, rev int64) error

	// Watch streams every change to keys with the given prefix that commits
	// after Watch returns, in revision order. The channel is closed when ctx
	// ends or the store closes. A watcher that does not keep up is
	// disconnected (its channel closed) rather than blocking writers.
	Watch(ctx context.Context, prefix string) (<-chan Event, error)

	// Txn commits ops as one: either every precondition holds and every
	// write commits at one new store-wide revision, which it returns (a
	// Txn of checks only writes nothing and returns the current
	// revision), or nothing changes and it returns an error wrapping
	// ErrConflict that names the first key whose precondition failed
	// (ErrConflict also for an OpDelete of an absent key). A key appears
	// at most once in ops; an empty ops, a repeated key, an unknown kind
	// or more than MaxTxnOps operations are refused with an error of
	// class apierr.ErrInvalid and change nothing (CheckTxn). Watchers see
	// the writes of one Txn as consecutive events with the same revision,
	// in the order of ops. The write is durable when Txn returns nil. Txn
	// does not retain ops or their values.
	Txn(ctx context.Context, ops []Op) (int64, error)

	// Close releases the store. Calls after Close return ErrClosed.
	Close() error
}

// Updater is implemented by stores that can run a read-modify-write as one
// atomic step inside their own commit, so that many writers of one hot
// record never conflict (store/bolt: inside its single writer
// transaction). Stores without it are used through a CAS retry loop.
//
// fn sees the current record (exists=false when the key is absent) and
// returns the new value, or del=true to delete the key, or an error to
// leave the record unchanged; that error is returned from Update as is.
// fn may run on the store's writer goroutine: it must be quick, must not
// block on other writers, and must not call the store's write methods
// (reads are allowed). Update returns the record as written (for a
// delete: Value nil and the delete's revision).
type Updater interface {
	Update(ctx context.Context, key string, fn func(cur KV, exists bool) (value []byte, del bool, err error)) (KV, error)
}

// MaxTxnOps bounds the operations of one Txn (etcd's own default limit,
// --max-txn-ops, is 128).
const MaxTxnOps = 128

// OpKind says what one operation of a Txn does.
type OpKind int

const (
	// OpPut writes Value at Key if its revision equals Rev (0: the key
	// must not exist), as Put does.
	OpPut OpKind = iota + 1
	// OpDelete removes Key if its revision equals Rev (which is never 0).
	OpDelete
	// OpCheck writes nothing: Key must still be at revision Rev (0: the
	// key must not exist) for the transaction to commit. It makes what a
	// transaction read a precondition of what it writes.
	OpCheck
)

// Op is one operation of a Txn.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte // OpPut only
	Rev   int64
}

// Txner is the transaction method of Store (whose Txn comment is the
// contract), for code that needs nothing else of a store.
type Txner interface {
	Txn(ctx context.Context, ops []Op) (int64, error)
}

// CheckTxn validates the shape of a Txn's ops (not their preconditions),
// for backends to call first.
func CheckTxn(ops []Op) error {
	if len(ops) == 0 {
		return apierr.Invalidf("store: empty transaction")
	}
	if len(ops) > MaxTxnOps {
		return apierr.Invalidf("store: transaction of %d operations (at most %d)", len(ops), MaxTxnOps)
	}
	seen := make(map[string]bool, len(ops))
	for _, o := range ops {
		if o.Key == "" {
			return apierr.Invalidf("store: transaction operation with an empty key")
		}
		if seen[o.Key] {
			return apierr.Invalidf("store: key %q appears twice in one transaction", o.Key)
		}
		seen[o.Key] = true
		switch o.Kind {
		case OpPut, OpCheck:
		case OpDelete:
			if o.Rev == 0 {
				return apierr.Invalidf("store: transaction deletes %q without a revision", o.Key)
			}
		default:
			return apierr.Invalidf("store: transaction operation of unknown kind %d on %q", o.Kind, o.Key)
		}
	}
	return nil
}

// AsTxner returns s as a Txner. Every Store has Txn since it became part
// of the contract (2026-11-28); AsTxner stays for callers written when it
// was optional, and fails only for a nil s.
func AsTxner(s Store) (Txner, bool) {
	if s == nil {
		return nil, false
	}
	return s, true
}

// HistoryWatcher is implemented by stores that keep a bounded history of
// recent changes, so a watch can resume where an earlier one stopped
// (store/bolt and store/mem: an in-memory ring of the latest events, empty
// after a restart; store/etcd: etcd's own history up to its compaction).
// Every backend in this repository implements it.
//
// The pair ListRevision + WatchFrom gives a gap-free view: list at R, then
// watch every change after R.
type HistoryWatcher interface {
	// ListRevision is List that also returns the store-wide revision the
	// list was read at: the result reflects every change with a revision
	// <= rev and none after it. rev is the store's current revision, not
	// the newest revision among the listed keys.
	ListRevision(ctx context.Context, prefix string) (kvs []KV, rev int64, err error)

	// Revision returns the store's current revision: every change at or
	// below it has committed.
	Revision(ctx context.Context) (int64, error)

	// WatchFrom is Watch starting after afterRev instead of after the
	// call: the channel receives every change to keys with the given
	// prefix whose revision is > afterRev, in revision order, the history
	// first and then live changes, with no gap and no duplicate. When the
	// store no longer keeps every change after afterRev, or afterRev is
	// beyond the store's current revision, WatchFrom returns an error
	// wrapping ErrCompacted whose text names the oldest revision it can
	// resume from. The channel is closed, like Watch's, when ctx ends, the
	// store closes, or the watcher falls behind; the caller may then call
	// WatchFrom again from the last revision it received.
	WatchFrom(ctx context.Context, prefix string, afterRev int64) (<-chan Event, error)
}

// Unwrapper is implemented by a Store that wraps another one (to count or
// time its calls, say), so that optional interfaces such as HistoryWatcher
// and Updater can be found on the store underneath with As.
type Unwrapper interface {
	Unwrap() Store
}

// AsHistoryWatcher returns s, or the first store s wraps (through
// Unwrapper), that implements HistoryWatcher.
func AsHistoryWatcher(s Store) (HistoryWatcher, bool) {
	for i := 0; s != nil && i < 16; i++ {
		if h, ok := s.(HistoryWatcher); ok {
			return h, true
		}
		u, ok := s.(Unwrapper)
		if !ok {
			return nil, false
		}
		s = u.Unwrap()
	}
	return nil, false
}
