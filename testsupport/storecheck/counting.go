package storecheck

import (
	"context"
	"strings"
	"sync"

	"github.com/corralhq/corral/store"
)

// Counting is a store that counts the operations made through it while
// Measure runs: reads (Get, List) and writes (Put, Delete), each by the
// key (a List by its prefix), and a Txn's operations one by one (a put or
// delete as a write, a check as a read of its key). Watch and the rest
// pass through uncounted.
// It is safe for concurrent use.
type Counting struct {
	store.Store
	mu  sync.Mutex
	on  bool
	ops []op
}

type op struct {
	key   string
	write bool
}

// Ops are the operations one Measure saw.
type Ops []op

// Reads counts the reads of keys under prefix ("" for every read).
func (o Ops) Reads(prefix string) int { return o.count(prefix, false) }

// Writes counts the writes of keys under prefix ("" for every write).
func (o Ops) Writes(prefix string) int { return o.count(prefix, true) }

func (o Ops) count(prefix string, write bool) int {
	n := 0
	for _, op := range o {
		if op.write == write && strings.HasPrefix(op.key, prefix) {
			n++
		}
	}
	return n
}

// Measure runs fn and returns the operations made through c while it ran.
// Measures must not overlap.
func (c *Counting) Measure(fn func()) Ops {
	c.mu.Lock()
	c.on, c.ops = true, nil
	c.mu.Unlock()
	fn()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	return c.ops
}

func (c *Counting) count(key string, write bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on {
		c.ops = append(c.ops, op{key, write})
	}
}

// Get counts a read of key.
func (c *Counting) Get(ctx context.Context, key string) (store.KV, error) {
	c.count(key, false)
	return c.Store.Get(ctx, key)
}

// List counts a read of prefix.
func (c *Counting) List(ctx context.Context, prefix string) ([]store.KV, error) {
	c.count(prefix, false)
	return c.Store.List(ctx, prefix)
}

// Put counts a write of key.
func (c *Counting) Put(ctx context.Context, key string, v []byte, rev int64) (int64, error) {
	c.count(key, true)
	return c.Store.Put(ctx, key, v, rev)
}

// Delete counts a write of key.
func (c *Counting) Delete(ctx context.Context, key string, rev int64) error {
	c.count(key, true)
	return c.Store.Delete(ctx, key, rev)
}

// Txn counts a write of each key ops put or delete and a read of each key
// they check.
func (c *Counting) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	for _, o := range ops {
		c.count(o.Key, o.Kind != store.OpCheck)
	}
	return c.Store.Txn(ctx, ops)
}
