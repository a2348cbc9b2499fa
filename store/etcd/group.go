package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/corralhq/corral/store"
)

// Group commit. Every write (Put, Delete, Txn) is a unit of compares and
// writes; the units waiting for etcd are sent together, as one etcd
// transaction, by whichever sender gets the next turn at the cluster
// (admit.go). A lone write on a quiet cluster goes at once, alone, as
// before; in a storm the writes that arrive while the cluster works on
// the last transactions share the next one, so what the cluster commits
// (its raft proposals, its WAL entries, its backend transactions, one
// each a request whatever its size) serves up to MaxTxnOps keys instead of
// one. On this machine's three members (bench/README.md, "Fleet storm on
// etcd") a storm was bounded by about 120 proposals a second, each
// carrying one machine's record or lease.
//
// A batch keeps every unit's meaning: it is If(every unit's compares)
// Then(every unit's writes) Else(a read of every key). When it succeeds,
// every unit committed at the one revision. When it fails, the reads show
// which units' compares failed; those get their conflict (or not-found)
// and the others go back to the head of the queue for the next batch,
// which therefore always loses at least one unit. Two units touching one
// key are never in one batch (the second's compare would be judged
// before the first's write): the later waits for the next.
//
// A unit waits at most AdmitWait in the queue (then it is refused as
// admission refuses, ErrBusy with a retry hint) and at most MaxQueued
// wait at once.

// maxBatchBytes bounds the values of one batch, under etcd's default
// request limit (--max-request-bytes, 1.5 MiB); a single larger unit goes
// alone and meets etcd's own refusal.
const maxBatchBytes = 1 << 20

// unit is one write waiting for, or in, a batch.
type unit struct {
	ctx   context.Context
	op    string         // "put", "delete" or "txn", for errors
	keys  []string       // the keys as given (without the store's prefix)
	revs  []int64        // the revision each key must have (0: must not exist)
	kinds []store.OpKind // what the unit does to each key
	vals  []string       // the values of puts ("" otherwise), copied when the unit is made: a caller that stops waiting may reuse its buffer while the unit is still sent
	size  int
	enq   time.Time

	abandoned atomic.Bool // the caller stopped waiting
	done      chan struct{}
	rev       int64
	err       error
}

// group is the queue of units and the senders draining it.
type group struct {
	mu      sync.Mutex
	queue   []*unit
	senders int

	batches atomic.Int64 // etcd transactions sent for units
	units   atomic.Int64 // units they carried
}

// GroupStats reports how many transactions carried writes to etcd and how
// many writes they carried (their ratio is the mean batch).
func (s *Store) GroupStats() (batches, units int64) {
	return s.grp.batches.Load(), s.grp.units.Load()
}

// commit queues u and waits for its outcome.
func (s *Store) commit(ctx context.Context, u *unit) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	u.ctx, u.enq, u.done = ctx, time.Now(), make(chan struct{})
	for i := range u.vals {
		u.size += len(u.keys[i]) + len(u.vals[i])
	}
	g := &s.grp
	g.mu.Lock()
	if len(g.queue) >= s.opts.MaxQueued {
		g.mu.Unlock()
		return 0, s.adm.refuse(u.op, u.keys[0], fmt.Sprintf("%d writes already wait for it", s.opts.MaxQueued))
	}
	if g.senders < s.opts.MaxInFlight {
		if !s.addWorker() {
			g.mu.Unlock()
			return 0, store.ErrClosed
		}
		g.senders++
		go s.sender()
	}
	g.queue = append(g.queue, u)
	g.mu.Unlock()
	select {
	case <-u.done:
		return u.rev, u.err
	case <-ctx.Done():
		u.abandoned.Store(true)
		return 0, fmt.Errorf("store/etcd: %s %s: %w", u.op, u.keys[0], ctx.Err())
	}
}

// addWorker counts a goroutine Close waits for, unless the store is
// closed: the count is taken under the lock Close sets closed under, so
// it never grows while Close waits (a unit queued then fails in pick, as
// the senders left fail every unit once the store's context ends).
func (s *Store) addWorker() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// finish gives u its outcome.
func (u *unit) finish(rev int64, err error) {
	u.rev, u.err = rev, err
	close(u.done)
}

// sender takes turns at the cluster and sends what waits at each turn,
// until nothing waits.
func (s *Store) sender() {
	defer s.wg.Done()
	for {
		if err := s.adm.acquire(s.base, "txn", "(group commit)"); err != nil {
			// No turn: what waits longest is told so, as a caller of its
			// own would have been.
			b := s.pick()
			for _, u := range b {
				if s.base.Err() != nil {
					u.finish(0, store.ErrClosed)
				} else {
					u.finish(0, s.adm.refuse(u.op, u.keys[0], "no turn at the cluster"))
				}
			}
			if b == nil {
				return
			}
			continue
		}
		b := s.pick()
		if b == nil {
			s.adm.release(0, false)
			return
		}
		start := time.Now()
		slow := s.send(b)
		s.adm.release(time.Since(start), slow)
	}
}

// pick takes the next batch from the queue: units in arrival order that
// fit (MaxTxnOps keys, maxBatchBytes) and touch no key another one in
// the batch does. It fails the units that waited too long and drops the
// abandoned. When the queue is empty it returns nil and the sender ends
// (counted under the same lock commit starts senders under).
func (s *Store) pick() []*unit {
	g := &s.grp
	g.mu.Lock()
	defer g.mu.Unlock()
	var (
		batch []*unit
		keys  = map[string]bool{}
		ops   int
		bytes int
		rest  = g.queue[:0]
		now   = time.Now()
	)
	for i, u := range g.queue {
		switch {
		case u.abandoned.Load():
			continue
		case now.Sub(u.enq) > s.opts.AdmitWait:
			u.finish(0, s.adm.refuse(u.op, u.keys[0], fmt.Sprintf("no turn within %s", s.opts.AdmitWait)))
			continue
		case len(batch) > 0 && (ops+len(u.keys) > store.MaxTxnOps || bytes+u.size > maxBatchBytes || slices.ContainsFunc(u.keys, func(k string) bool { return keys[k] })),
			i >= 4*store.MaxTxnOps: // scan a bounded part of a long queue
			rest = append(rest, u)
			continue
		}
		batch = append(batch, u)
		ops += len(u.keys)
		bytes += u.size
		for _, k := range u.keys {
			keys[k] = true
		}
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	if len(batch) == 0 {
		g.senders--
	}
	return batch
}

// requeue puts units back at the head of the queue (innocent members of a
// batch another unit's compare failed).
func (s *Store) requeue(us []*unit) {
	g := &s.grp
	g.mu.Lock()
	g.queue = append(slices.Clone(us), g.queue...)
	g.mu.Unlock()
}

// send commits batch b as one transaction and gives each unit its
// outcome. It reports whether the request ran out of time (for the
// admission's bound).
func (s *Store) send(b []*unit) (slow bool) {
	var cmps []clientv3.Cmp
	var writes, reads []clientv3.Op
	for _, u := range b {
		for i, key := range u.keys {
			k := s.prefix + key
			cmps = append(cmps, cmpRev(k, u.revs[i]))
			reads = append(reads, clientv3.OpGet(k, clientv3.WithKeysOnly()))
			switch u.kinds[i] {
			case store.OpPut:
				writes = append(writes, clientv3.OpPut(k, u.vals[i]))
			case store.OpDelete:
				writes = append(writes, clientv3.OpDelete(k))
			case store.OpCheck:
			}
		}
	}
	s.grp.batches.Add(1)
	s.grp.units.Add(int64(len(b)))
	first := b[0]
	var resp *clientv3.TxnResponse
	rctx, cancel := s.reqCtx(s.base)
	defer cancel()
	err := s.retry(rctx, false, func(rctx context.Context) (err error) {
		resp, err = s.cli.Txn(rctx).If(cmps...).Then(writes...).Else(reads...).Commit()
		return err
	})
	if err != nil {
		for _, u := range b {
			u.finish(0, s.wrap(u.ctx, u.op, u.keys[0], err))
		}
		return rctx.Err() != nil
	}
	if resp.Succeeded {
		for _, u := range b {
			u.finish(resp.Header.Revision, nil)
		}
		return false
	}
	// The reads ran at the revision the compares failed at.
	var innocent []*unit
	n := 0
	for _, u := range b {
		if err := u.judge(resp.Responses[n : n+len(u.keys)]); err != nil {
			u.finish(0, err)
		} else {
			innocent = append(innocent, u)
		}
		n += len(u.keys)
	}
	if len(innocent) == len(b) {
		// Every compare held when read: only a unit alone can be judged
		// so (a check racing the batch cannot happen within one
		// revision); say so rather than send the batch again forever.
		innocent[0].finish(0, fmt.Errorf("store/etcd: %s %q: %w", first.op, first.keys[0], store.ErrConflict))
		innocent = innocent[1:]
	}
	if len(innocent) > 0 {
		s.requeue(innocent)
	}
	return false
}

// judge names the failed precondition of u from the reads of its keys, or
// returns nil if every one held.
func (u *unit) judge(reads []*etcdserverpb.ResponseOp) error {
	for i, key := range u.keys {
		var cur int64
		if r := reads[i].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
			cur = r.Kvs[0].ModRevision
		}
		want := u.revs[i]
		if cur == want {
			continue
		}
		switch u.op {
		case "put":
			return fmt.Errorf("%s: %w", key, store.ErrConflict)
		case "delete":
			if cur == 0 {
				return fmt.Errorf("%s: %w", key, store.ErrNotFound)
			}
			return fmt.Errorf("%s: %w", key, store.ErrConflict)
		}
		switch {
		case want == 0:
			return fmt.Errorf("store/etcd: txn: %q exists at revision %d: %w", key, cur, store.ErrConflict)
		case cur == 0:
			return fmt.Errorf("store/etcd: txn: %q at revision %d: key does not exist: %w", key, want, store.ErrConflict)
		default:
			return fmt.Errorf("store/etcd: txn: %q at revision %d: current revision is %d: %w", key, want, cur, store.ErrConflict)
		}
	}
	return nil
}
