// Package keyrate keeps a token-bucket rate limiter per key (a token id, a
// MAC, a source address) in a table of bounded size: past its size the
// key used least recently is forgotten, so a flood of new keys costs a
// fixed amount of memory. It imports nothing of ours.
package keyrate

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Table is the limiters of many keys, each a token bucket of Burst tokens
// refilled at Rate a second. It is safe for concurrent use.
//
// A forgotten key starts again with a full bucket. The least recently
// used key goes first, so a key being flooded (used at every call) is the
// last to go: forgetting it takes more distinct keys than the table
// holds, at the rate of the limit that bounds those keys (per source,
// for the tokens).
type Table struct {
	rate  rate.Limit
	burst int
	max   int

	mu   sync.Mutex
	keys map[string]*list.Element // value *entry
	lru  *list.List               // front: used most recently
	// forgotten counts the keys pushed out by the size bound.
	forgotten uint64
}

type entry struct {
	key string
	lim *rate.Limiter
}

// New returns a table of at most maxKeys keys (at least 1), each allowed
// burst calls at once and perSecond a second after.
func New(perSecond float64, burst, maxKeys int) *Table {
	return &Table{rate: rate.Limit(perSecond), burst: max(burst, 1), max: max(maxKeys, 1),
		keys: map[string]*list.Element{}, lru: list.New()}
}

// Allow takes a token of key's bucket at now and reports whether there was
// one. It never blocks.
func (t *Table) Allow(key string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.keys[key]
	if ok {
		t.lru.MoveToFront(el)
	} else {
		if t.lru.Len() >= t.max {
			old := t.lru.Back()
			t.lru.Remove(old)
			delete(t.keys, old.Value.(*entry).key)
			t.forgotten++
		}
		el = t.lru.PushFront(&entry{key: key, lim: rate.NewLimiter(t.rate, t.burst)})
		t.keys[key] = el
	}
	return el.Value.(*entry).lim.AllowN(now, 1)
}

// Len is how many keys the table holds.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

// Forgotten is how many keys the size bound pushed out, ever.
func (t *Table) Forgotten() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.forgotten
}
