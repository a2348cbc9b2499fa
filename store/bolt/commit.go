package bolt

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/corralhq/corral/store"
)

type opKind uint8

const (
	opPut opKind = iota + 1
	opDelete
	opUpdate
	opTxn
)

// op is one queued write. The committer answers on done exactly once.
type op struct {
	ctx   context.Context
	kind  opKind
	key   string
	value []byte
	rev   int64
	fn    func(cur store.KV, exists bool) ([]byte, bool, error) // opUpdate
	txn   []store.Op                                            // opTxn: checked by store.CheckTxn and checkKey
	done  chan result
	// urgent: the op may not wait for the commit window (window.go).
	urgent bool
}

type result struct {
	rev   int64
	value []byte // opUpdate: the value written (nil for a delete)
	err   error
}

// errNoChanges rolls back a batch in which every op failed its
// precondition: there is nothing to write, so nothing to fsync.
var errNoChanges = errors.New("bolt: batch has no changes")

// opPool recycles ops and their answer channels: every write took two
// allocations for them, at thousands of leases a second a steady share of
// what the garbage collector has to chase (bench/results/2026-11-dhcp.md,
// 25 Nov 2026). An op goes back only after its answer was received, when
// nothing else refers to it: the committer drops its batch's references
// (commitQueued), and answers each op exactly once.
var opPool = sync.Pool{New: func() any { return &op{done: make(chan result, 1)} }}

// newOp returns a pooled op of kind for key at rev.
func newOp(kind opKind, key string, rev int64) *op {
	o := opPool.Get().(*op)
	o.kind, o.key, o.rev = kind, key, rev
	return o
}

// freeOp returns o to the pool, its references dropped. Its answer
// channel, empty again, goes with it.
func freeOp(o *op) {
	done := o.done
	*o = op{done: done}
	opPool.Put(o)
}

// submit queues o (from newOp) for the committer and waits for its
// result, then frees o. Once queued, it waits for the answer even if ctx
// ends, so the caller never has to guess whether the write happened; an
// op whose ctx has ended before the committer reaches it is skipped and
// answered with the ctx error.
func (s *Store) submit(ctx context.Context, o *op) (int64, error) {
	r, err := s.await(ctx, o)
	if err != nil {
		return 0, err
	}
	return r.rev, r.err
}

// await queues o (from newOp) and waits for its answer, then frees o. The
// error is one that kept o from being queued.
func (s *Store) await(ctx context.Context, o *op) (result, error) {
	defer freeOp(o)
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	if err := s.enter(); err != nil {
		return result{}, err
	}
	defer s.closeMu.RUnlock()

	o.ctx = ctx
	if err := s.queue(ctx, o); err != nil {
		return result{}, err
	}
	return <-o.done, nil
}

// queue puts o on the committer's queue and, when no batch is being
// committed, commits the queue (o first among them, up to maxBatch) on
// the caller's goroutine: a lone write then costs no hand-off to the
// committer goroutine and back, two context switches that on a busy core
// cost more than the commit's own CPU. While a batch is being committed,
// o waits for the next one, which the committer goroutine takes (it is
// woken by whoever finishes a batch and finds more queued). Either way o
// is answered on o.done.
//
// With a single P, the caller first yields once: the writers already
// runnable (a burst of DHCP requests handed to workers) queue their
// writes and wait, and the batch takes them all. Without the yield the
// first writer commits alone, and with fdatasync holding the P (sync.go)
// nothing else could queue meanwhile: one flush per write.
func (s *Store) queue(ctx context.Context, o *op) error {
	s.queued(o)
	s.pending.Add(1)
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.pending.Add(-1)
		s.taken(o)
		return ctx.Err()
	}
	s.queuedSent(o)
	if s.committing.CompareAndSwap(false, true) {
		if oneP() {
			runtime.Gosched()
		}
		s.commitQueued()
		s.committing.Store(false)
		if s.pending.Load() > 0 {
			s.wakeCommitter()
		}
	}
	return nil
}

// wakeCommitter tells the committer goroutine there is a queue to commit.
func (s *Store) wakeCommitter() {
	select {
	case s.wake <- struct{}{}:
	default: // already told
	}
}

// Update implements store.Updater: fn runs inside the committer's
// transaction, so concurrent updates of one key never conflict and share
// fsyncs with the rest of the batch.
func (s *Store) Update(ctx context.Context, key string, fn func(cur store.KV, exists bool) ([]byte, bool, error)) (store.KV, error) {
	if err := checkKey(key); err != nil {
		return store.KV{}, fmt.Errorf("bolt: update: %w", err)
	}
	o := newOp(opUpdate, key, 0)
	o.fn = fn
	r, err := s.await(ctx, o)
	if err != nil {
		return store.KV{}, err
	}
	if r.err != nil {
		return store.KV{}, r.err
	}
	return store.KV{Key: key, Value: r.value, Revision: r.rev}, nil
}

// Txn implements store.Store's transaction: it is one op of the
// committer's batch, its preconditions checked against the state the ops
// before it left (the overlay and bbolt), its writes journaled in the
// batch's one record (or written in the batch's one bbolt transaction)
// at one revision and published together. A transaction that only checks
// writes nothing and is answered without a flush of its own.
func (s *Store) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	if err := store.CheckTxn(ops); err != nil {
		return 0, fmt.Errorf("bolt: txn: %w", err)
	}
	for _, t := range ops {
		if err := checkKey(t.Key); err != nil {
			return 0, fmt.Errorf("bolt: txn: %w", err)
		}
	}
	o := newOp(opTxn, "", 0)
	o.txn = ops
	rev, err := s.submit(ctx, o)
	if err != nil {
		return 0, fmt.Errorf("bolt: %w", err)
	}
	return rev, nil
}

// runUpdate runs o's update function on the current record (cur, val,
// exists): the value to write, or del, or the error to answer (the
// function's, or store.ErrNotFound for a delete of a missing key).
func runUpdate(o *op, cur int64, val []byte, exists bool) ([]byte, bool, error) {
	var curKV store.KV
	if exists {
		curKV = store.KV{Key: o.key, Value: append([]byte(nil), val...), Revision: cur}
	}
	v, del, err := callUpdate(o.fn, curKV, exists)
	if err == nil && del && !exists {
		err = store.ErrNotFound
	}
	return v, del, err
}

// callUpdate runs an update function, turning a panic into an error so a
// bad caller cannot take the writer down.
func callUpdate(fn func(store.KV, bool) ([]byte, bool, error), cur store.KV, exists bool) (v []byte, del bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bolt: update function panicked: %v", r)
		}
	}()
	return fn(cur, exists)
}

// commitLoop commits what callers leave queued while a batch of theirs
// is being committed. It runs whenever woken, while anything is queued
// and no caller is committing, and returns when s.wake is closed.
//
// Exactly one goroutine commits at a time: the one that set s.committing
// (this one or a caller in queue). Everything the comments call
// "committer only" belongs to it; s.committing's compare-and-swap and
// store order one committer's work before the next one's.
func (s *Store) commitLoop() {
	defer close(s.committerDone)
	for range s.wake {
		for s.pending.Load() > 0 && s.committing.CompareAndSwap(false, true) {
			n := s.commitQueued()
			s.committing.Store(false)
			if n == 0 {
				break // a caller's op is on its way: that caller commits it
			}
		}
	}
}

// commitQueued takes what is queued (up to maxBatch) and commits it in
// one transaction, once the commit window (window.go), if any, has
// passed since the last batch was taken. It returns how many ops it took.
// Committer only.
func (s *Store) commitQueued() int {
	waited := s.awaitWindow()
	batch := s.batch[:0]
drain:
	for len(batch) < maxBatch {
		select {
		case o := <-s.ops:
			s.taken(o)
			batch = append(batch, o)
		default:
			break drain
		}
	}
	if len(batch) == 0 {
		return 0
	}
	if s.window > 0 {
		s.lastFlush = time.Now()
		if waited {
			s.windowTaken(len(batch))
		}
	}
	s.pending.Add(-int64(len(batch)))
	s.commit(batch)
	clear(batch) // drop references to values
	s.batch = batch
	return len(batch)
}

// commit applies batch in order: through the journal (journal.go) unless
// Options.NoJournal, else inside one read-write transaction. Each
// op's precondition is checked against the state left by the ops before it;
// an op that fails its precondition gets its own error and does not abort
// the transaction. If the commit itself fails, every op gets that error and
// no event is published. Events are published only after a successful
// commit, then every op is answered.
func (s *Store) commit(batch []*op) {
	if s.failed != nil {
		for _, o := range batch {
			o.done <- result{err: fmt.Errorf("commit: the store journal failed earlier, writes are refused until restart: %w", s.failed)}
		}
		return
	}
	if s.jr == nil {
		s.commitBolt(batch)
		return
	}
	if s.commitJournal(batch) {
		return
	}
	// Too big for the journal: fold, then commit to bbolt directly.
	if err := s.fold(); err != nil {
		s.log.Error("store commit failed", "path", s.path, "ops", len(batch), "err", err)
		for _, o := range batch {
			o.done <- result{err: fmt.Errorf("commit: %w", err)}
		}
		return
	}
	s.commitBolt(batch)
	if rev, err := s.boltRevision(); err == nil {
		s.ovMu.Lock()
		s.ovRev = rev
		s.ovMu.Unlock()
	}
}

// commitBolt commits batch in one bbolt transaction (two fdatasyncs).
func (s *Store) commitBolt(batch []*op) {
	results := make([]result, len(batch))
	var events []store.Event

	err := s.db.Update(func(tx *bbolt.Tx) error {
		recs := tx.Bucket(recordsBucket)
		meta := tx.Bucket(metaBucket)
		if recs == nil || meta == nil {
			return corruptf("store buckets missing")
		}
		rev, err := decodeRev(meta.Get(revKey))
		if err != nil {
			return err
		}
		for i, o := range batch {
			if err := o.ctx.Err(); err != nil {
				results[i].err = err
				continue
			}
			if o.kind == opTxn {
				if err := txnConflict(o.txn, func(key string) (int64, bool, error) { return currentRev(recs, []byte(key)) }); err != nil {
					results[i].err = err
					continue
				}
				if txnWrites(o.txn) {
					// A failed write aborts the whole batch: the
					// transaction's earlier writes cannot be taken back
					// alone.
					for _, t := range o.txn {
						if t.Kind == store.OpCheck {
							continue
						}
						ev, err := applyTxnOp(recs, t, rev+1)
						if err != nil {
							return fmt.Errorf("txn: %q: %w", t.Key, err)
						}
						events = append(events, ev)
					}
					rev++
				}
				results[i].rev = rev
				continue
			}
			key := []byte(o.key)
			cur, exists, err := currentRev(recs, key)
			if err != nil {
				results[i].err = err
				continue
			}
			switch o.kind {
			case opPut:
				if err := putConflict(o.rev, cur, exists); err != nil {
					results[i].err = err
					continue
				}
				if err := recs.Put(key, encodeRecord(rev+1, o.value)); err != nil {
					results[i].err = err
					continue
				}
				rev++
				events = append(events, store.Event{Type: store.EventPut, KV: store.KV{Key: o.key, Value: o.value, Revision: rev}})
			case opUpdate:
				var v []byte
				if exists {
					_, v, err = decodeRecord(recs.Get(key))
					if err != nil {
						results[i].err = err
						continue
					}
				}
				val, del, ferr := runUpdate(o, cur, v, exists)
				if ferr != nil {
					results[i].err = ferr
					continue
				}
				if del {
					if err := recs.Delete(key); err != nil {
						results[i].err = err
						continue
					}
					rev++
					events = append(events, store.Event{Type: store.EventDelete, KV: store.KV{Key: o.key, Revision: rev}})
					break
				}
				val = append([]byte(nil), val...)
				if err := recs.Put(key, encodeRecord(rev+1, val)); err != nil {
					results[i].err = err
					continue
				}
				rev++
				results[i].value = val
				events = append(events, store.Event{Type: store.EventPut, KV: store.KV{Key: o.key, Value: val, Revision: rev}})
			case opDelete:
				switch {
				case !exists:
					results[i].err = store.ErrNotFound
					continue
				case cur != o.rev:
					results[i].err = fmt.Errorf("expected revision %d, current is %d: %w", o.rev, cur, store.ErrConflict)
					continue
				}
				if err := recs.Delete(key); err != nil {
					results[i].err = err
					continue
				}
				rev++
				events = append(events, store.Event{Type: store.EventDelete, KV: store.KV{Key: o.key, Revision: rev}})
			case opTxn:
				// Applied above, as a whole.
			}
			results[i].rev = rev
		}
		if len(events) == 0 {
			return errNoChanges
		}
		return meta.Put(revKey, encodeRev(rev))
	})

	switch {
	case err == nil:
		s.commits.Add(1)
		s.writes.Add(int64(len(events)))
		s.hub.Publish(events)
	case errors.Is(err, errNoChanges):
	default:
		s.log.Error("store commit failed", "path", s.path, "ops", len(batch), "err", err)
		for i := range results {
			results[i] = result{err: fmt.Errorf("commit: %w", err)}
		}
	}
	for i, o := range batch {
		o.done <- results[i]
	}
}

// txnConflict checks the preconditions of a transaction's ops against
// current (the revision of a key as of the ops before it, exists=false when
// absent) and returns the error naming the first key that fails.
func txnConflict(ops []store.Op, current func(key string) (int64, bool, error)) error {
	for _, t := range ops {
		cur, exists, err := current(t.Key)
		if err != nil {
			return fmt.Errorf("txn: %q: %w", t.Key, err)
		}
		if err := putConflict(t.Rev, cur, exists); err != nil {
			return fmt.Errorf("txn: %q: %w", t.Key, err)
		}
	}
	return nil
}

// txnWrites reports whether a transaction writes anything.
func txnWrites(ops []store.Op) bool {
	return slices.ContainsFunc(ops, func(t store.Op) bool { return t.Kind != store.OpCheck })
}

// applyTxnOp writes a put or a delete of a transaction into recs at rev
// and returns its event.
func applyTxnOp(recs *bbolt.Bucket, t store.Op, rev int64) (store.Event, error) {
	if t.Kind == store.OpDelete {
		return store.Event{Type: store.EventDelete, KV: store.KV{Key: t.Key, Revision: rev}}, recs.Delete([]byte(t.Key))
	}
	return store.Event{Type: store.EventPut, KV: store.KV{Key: t.Key, Value: t.Value, Revision: rev}}, recs.Put([]byte(t.Key), encodeRecord(rev, t.Value))
}

// currentRev reports the revision of key in recs.
func currentRev(recs *bbolt.Bucket, key []byte) (int64, bool, error) {
	raw := recs.Get(key)
	if raw == nil {
		return 0, false, nil
	}
	rev, _, err := decodeRecord(raw)
	if err != nil {
		return 0, false, err
	}
	return rev, true, nil
}

// putConflict is the compare-and-swap check of a Put expecting revision
// want (0: the key must not exist) against the key's current revision.
func putConflict(want, cur int64, exists bool) error {
	switch {
	case want == 0 && exists:
		return fmt.Errorf("exists at revision %d: %w", cur, store.ErrConflict)
	case want != 0 && !exists:
		return fmt.Errorf("expected revision %d but key does not exist: %w", want, store.ErrConflict)
	case exists && cur != want:
		return fmt.Errorf("expected revision %d, current is %d: %w", want, cur, store.ErrConflict)
	}
	return nil
}
