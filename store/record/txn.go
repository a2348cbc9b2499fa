package record

import (
	"context"
	"errors"
	"fmt"

	"github.com/corralhq/corral/store"
	"google.golang.org/protobuf/proto"
)

// Tx is one optimistic multi-key transaction over records: it remembers
// the revision of every key it reads, and Commit writes its changes as one
// store.Txn whose preconditions are those revisions, so the writes commit
// only if nothing it read has changed since. A Tx is used by one
// goroutine; RunTx makes a fresh one per attempt.
type Tx struct {
	s     store.Store
	read  map[string]int64  // key -> revision read (0: absent)
	vals  map[string][]byte // key -> value read
	order []string          // keys in first-touch order
	ops   map[string]store.Op
}

// Get reads key into msg and reports whether it exists. A key is read
// from the store once per Tx: reading it again decodes what the first read
// saw, so a transaction sees one version of every key it reads, and the
// commit checks that version.
func (t *Tx) Get(ctx context.Context, key string, msg proto.Message) (bool, error) {
	raw, seen := t.vals[key]
	if !seen {
		kv, err := t.s.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			kv = store.KV{}
		case err != nil:
			return false, err
		}
		t.remember(key, kv.Revision, kv.Value)
		raw = kv.Value
	}
	if t.read[key] == 0 {
		return false, nil
	}
	if err := Unmarshal(raw, msg); err != nil {
		return false, fmt.Errorf("%s: %w", key, err)
	}
	return true, nil
}

func (t *Tx) remember(key string, rev int64, raw []byte) {
	if t.read == nil {
		t.read = map[string]int64{}
		t.vals = map[string][]byte{}
		t.ops = map[string]store.Op{}
	}
	t.read[key] = rev
	t.vals[key] = raw
	t.order = append(t.order, key)
}

// Put writes msg at key when the transaction commits. The key must have
// been read by this Tx first (its revision is the precondition).
func (t *Tx) Put(key string, msg proto.Message) error {
	rev, ok := t.read[key]
	if !ok {
		return fmt.Errorf("record: transaction writes %q without reading it", key)
	}
	b, err := Marshal(msg)
	if err != nil {
		return err
	}
	t.ops[key] = store.Op{Kind: store.OpPut, Key: key, Value: b, Rev: rev}
	return nil
}

// Delete removes key when the transaction commits; it must have been read
// by this Tx and found. Deleting an absent key does nothing.
func (t *Tx) Delete(key string) error {
	rev, ok := t.read[key]
	if !ok {
		return fmt.Errorf("record: transaction deletes %q without reading it", key)
	}
	if rev == 0 {
		delete(t.ops, key)
		return nil
	}
	t.ops[key] = store.Op{Kind: store.OpDelete, Key: key, Rev: rev}
	return nil
}

// Writes reports whether the transaction has anything to write.
func (t *Tx) Writes() bool { return len(t.ops) > 0 }

// Commit runs the transaction: every key read and not written is checked,
// every key written is compare-and-swapped at the revision read. A
// transaction that writes nothing commits nothing and returns 0. The error
// wraps store.ErrConflict when something read has changed.
func (t *Tx) Commit(ctx context.Context) (int64, error) {
	if len(t.ops) == 0 {
		return 0, nil
	}
	ops := make([]store.Op, 0, len(t.order))
	for _, key := range t.order {
		rev := t.read[key]
		if op, ok := t.ops[key]; ok {
			ops = append(ops, op)
			continue
		}
		ops = append(ops, store.Op{Kind: store.OpCheck, Key: key, Rev: rev})
	}
	return t.s.Txn(ctx, ops)
}

// RunTx runs fn in a fresh Tx and commits it, again from the start while
// the commit conflicts (with the same back-off as Update), until ctx ends.
// fn may return an error to abort without writing; it is returned as is.
// fn may run more than once, so it must only derive what it writes from
// what it reads through tx.
func RunTx(ctx context.Context, s store.Store, fn func(tx *Tx) error) (int64, error) {
	pause := conflictBackoff()
	for attempt := 0; ; attempt++ {
		tx := &Tx{s: s}
		if err := fn(tx); err != nil {
			return 0, err
		}
		rev, err := tx.Commit(ctx)
		if errors.Is(err, store.ErrConflict) {
			if err := wait(ctx, attempt, &pause); err != nil {
				return 0, err
			}
			continue
		}
		return rev, err
	}
}
