package timeline

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// macState is the index entry of one MAC.
type macState struct {
	mac   string
	count int // entries believed stored
	since int // entries written since the last trim
	// lanSince are the boot-LAN entries among since.
	lanSince int
	last     time.Time // newest entry written
	// pending are the keys being stored, true once a trim counted them
	// (at most one per writer).
	pending map[string]bool
	// el is the MAC's element in Timeline.lru, or in Timeline.held when
	// held (an eviction left it record entries only).
	el   *list.Element
	held bool
}

// push adds a new MAC at the front of the least-recently-written order.
// t.mu must be held.
func (t *Timeline) push(mac string) *macState {
	ms := &macState{mac: mac, pending: map[string]bool{}}
	ms.el = t.lru.PushFront(ms)
	t.macs[mac] = ms
	return ms
}

// bootLANEntry says whether a stored entry is of the boot-LAN class: by
// its key's suffix, or, for a key written before the classes, by its
// source.
func bootLANEntry(kv store.KV) bool {
	switch {
	case strings.HasSuffix(kv.Key, bootLANSuffix):
		return true
	case strings.HasSuffix(kv.Key, recordSuffix):
		return false
	}
	var e inventoryv1.TimelineEntry
	return record.Unmarshal(kv.Value, &e) == nil && bootLANSources[e.GetSource()]
}

// split returns kvs's boot-LAN entries and its record entries, each in
// key (time) order.
func split(kvs []store.KV) (lan, rec []store.KV) {
	for _, kv := range kvs {
		if bootLANEntry(kv) {
			lan = append(lan, kv)
		} else {
			rec = append(rec, kv)
		}
	}
	return lan, rec
}

// snapshot copies ms without its pending map (for save).
func (ms *macState) snapshot() macState {
	return macState{mac: ms.mac, count: ms.count, since: ms.since, last: ms.last}
}

func (t *Timeline) stripe(mac string) *sync.Mutex {
	return &t.stripes[maphash.String(t.seed, mac)%uint64(len(t.stripes))]
}

// resync lists a MAC's entries, deletes the oldest of each class beyond
// its cap (BootLAN.Limit, Limit), sets its count to what is left and
// writes its index record. The MAC's stripe must be held.
func (t *Timeline) resync(ctx context.Context, ms *macState) {
	kvs, err := t.cfg.Store.List(ctx, Prefix+ms.mac+"/")
	if err != nil {
		return // counted as written; the next trim tries again
	}
	lan, rec := split(kvs)
	over := slices.Concat(lan[:max(0, len(lan)-t.cfg.BootLAN.Limit)], rec[:max(0, len(rec)-t.cfg.Limit)])
	left := len(kvs) - t.deleteAll(ctx, over)
	t.mu.Lock()
	ms.since, ms.lanSince = 0, 0
	// Entries stored but not yet counted by their writers are in left.
	for k := range ms.pending {
		if i := sort.Search(len(kvs), func(i int) bool { return kvs[i].Key >= k }); i < len(kvs) && kvs[i].Key == k {
			ms.pending[k] = true
		}
	}
	if cur, ok := t.macs[ms.mac]; ok && cur == ms {
		t.total += left - ms.count
		ms.count = left
	}
	snap := ms.snapshot()
	t.mu.Unlock()
	t.save(ctx, snap, false)
}

// evict deletes the boot-LAN entries of the least recently written MACs
// until the total is within MaxEntries, looking at most at budget MACs
// (negative: no limit; a write needs one eviction at most, as it adds one
// entry). A MAC left with record entries is held apart with them (never
// evicted); one left with none is forgotten.
func (t *Timeline) evict(ctx context.Context, budget int) {
	for ; budget != 0; budget-- {
		t.mu.Lock()
		if t.total <= t.cfg.MaxEntries || t.lru.Len() <= 1 {
			t.mu.Unlock()
			return
		}
		// The least recent MAC with no entry being stored: a MAC whose
		// entries are in flight (a batch is stored before it is counted)
		// keeps its place and its entries, which must not be deleted
		// uncounted. A flood's in-flight MACs are looked past, a bounded
		// number of them.
		el := t.lru.Back()
		for skip := 0; el != nil && len(el.Value.(*macState).pending) > 0; skip++ {
			if skip == evictScan {
				el = nil
				break
			}
			el = el.Prev()
		}
		if el == nil {
			t.mu.Unlock()
			return
		}
		ms := el.Value.(*macState)
		t.lru.Remove(ms.el)
		delete(t.macs, ms.mac)
		t.total -= ms.count
		total := t.total
		t.mu.Unlock()

		st := t.stripe(ms.mac)
		st.Lock()
		t.mu.Lock()
		if cur, back := t.macs[ms.mac]; back {
			// Written again meanwhile: no longer the least recent. Its
			// entries stay, counted in its new index entry.
			cur.count += ms.count
			t.total += ms.count
			t.mu.Unlock()
			st.Unlock()
			continue
		}
		t.mu.Unlock()
		kvs, err := t.cfg.Store.List(ctx, Prefix+ms.mac+"/")
		if err != nil {
			// Unreadable now: held with what it was believed to hold,
			// looked at again once it gets boot-LAN entries.
			t.hold(ctx, ms, ms.count)
			st.Unlock()
			continue
		}
		lan, rec := split(kvs)
		deleted := t.deleteAll(ctx, lan)
		kept := len(kvs) - deleted
		if len(rec) > 0 {
			t.hold(ctx, ms, kept)
		} else if kv, err := t.cfg.Store.Get(ctx, indexPrefix+ms.mac); err == nil {
			_ = t.cfg.Store.Delete(ctx, kv.Key, kv.Revision)
		}
		st.Unlock()
		t.evicted.Add(1, func(n int64) {
			t.log.Warn("timeline over its total limit: deleted the boot-LAN entries of the MACs written to least recently (their record entries stay)",
				"mac", ms.mac, "entries", deleted, "record_entries_kept", kept, "last_entry", ms.last.UTC().Format(time.RFC3339),
				"total", total, "limit", t.cfg.MaxEntries, "macs_evicted_since_last_log", n)
		})
	}
}

// hold puts an evicted MAC back, with count entries, among the held MACs
// and writes its index record. The MAC's stripe must be held.
func (t *Timeline) hold(ctx context.Context, old *macState, count int) {
	t.mu.Lock()
	ms := &macState{mac: old.mac, count: count, last: old.last, pending: map[string]bool{}, held: true}
	ms.el = t.held.PushFront(ms)
	t.macs[ms.mac] = ms
	t.total += count
	snap := ms.snapshot()
	t.mu.Unlock()
	t.save(ctx, snap, false)
}

// deleteAll deletes kvs, several at a time, and returns how many it
// deleted (an entry already gone counts: it is gone).
func (t *Timeline) deleteAll(ctx context.Context, kvs []store.KV) int {
	var n atomic.Int64
	var g errgroup.Group
	g.SetLimit(deleteParallel)
	for _, kv := range kvs {
		g.Go(func() error {
			if err := t.cfg.Store.Delete(ctx, kv.Key, kv.Revision); err == nil || errors.Is(err, store.ErrNotFound) {
				n.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait() // the deletes return nil: a failed one is just not counted
	return int(n.Load())
}

// save writes a MAC's index record: a TimelineEntry whose At is the MAC's
// newest entry and whose "entries" attribute is its count. create tries a
// create-only write first (one store operation for a new MAC).
func (t *Timeline) save(ctx context.Context, ms macState, create bool) {
	e := &inventoryv1.TimelineEntry{Mac: ms.mac, At: timestamppb.New(ms.last), Source: "inventory", Event: "timeline-index",
		Attributes: map[string]string{"entries": strconv.Itoa(ms.count)}}
	key := indexPrefix + ms.mac
	// Writes of this key are serialised by the MAC's stripe within this
	// appliance (Run loads and saves without writers running). In a fleet
	// the other appliances that record the MAC's events write it too: the
	// record is then the last writer's view of the count, until the next
	// trim re-counts the stored entries; a few retries ride out their
	// concurrent writes.
	var err error
	if create {
		if _, err = record.Put(ctx, t.cfg.Store, key, e, 0); !errors.Is(err, store.ErrConflict) {
			t.saveFailed(ms.mac, err)
			return
		}
	}
	for range 8 {
		var rev int64
		kv, gerr := t.cfg.Store.Get(ctx, key)
		switch {
		case gerr == nil:
			rev = kv.Revision
		case !errors.Is(gerr, store.ErrNotFound):
			err = gerr
		}
		if gerr != nil && !errors.Is(gerr, store.ErrNotFound) {
			break
		}
		if _, err = record.Put(ctx, t.cfg.Store, key, e, rev); !errors.Is(err, store.ErrConflict) {
			break
		}
	}
	t.saveFailed(ms.mac, err)
}

func (t *Timeline) saveFailed(mac string, err error) {
	if err != nil {
		t.failed.Add(1, func(n int64) {
			t.log.Warn("timeline index write failed", "mac", mac, "err", err, "failed_since_last_log", n)
		})
	}
}

// saveAll writes the index record of every MAC written to since its last
// trim (at shutdown, so that counts survive a restart).
func (t *Timeline) saveAll(ctx context.Context) {
	t.mu.Lock()
	var dirty []macState
	for _, ms := range t.macs {
		if ms.since > 0 {
			dirty = append(dirty, ms.snapshot())
			ms.since, ms.lanSince = 0, 0
		}
	}
	t.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(deleteParallel)
	for _, ms := range dirty {
		g.Go(func() error { t.save(ctx, ms, false); return nil })
	}
	_ = g.Wait() // save returns nothing: it logs its own failures
}

// load builds the index from the index records, or, when there are none,
// from the entries themselves (once: it writes the records).
func (t *Timeline) load(ctx context.Context) {
	start := time.Now()
	kvs, err := t.cfg.Store.List(ctx, indexPrefix)
	if err != nil {
		t.log.Warn("timeline index unreadable: counting from new writes only", "err", err)
		return
	}
	var states []macState
	for _, kv := range kvs {
		var e inventoryv1.TimelineEntry
		mac := strings.TrimPrefix(kv.Key, indexPrefix)
		if err := record.Unmarshal(kv.Value, &e); err != nil {
			continue
		}
		n, err := strconv.Atoi(e.GetAttributes()["entries"])
		if err != nil || n < 0 {
			n = t.cfg.Limit // unknown: assume full
		}
		states = append(states, macState{mac: mac, count: n, last: e.GetAt().AsTime()})
	}
	indexed, complete := len(states) > 0, true
	if !indexed {
		states, complete = t.scan(ctx)
	}
	sort.Slice(states, func(a, b int) bool { return states[a].last.Before(states[b].last) })
	t.mu.Lock()
	for _, ms := range states {
		ms.pending = map[string]bool{}
		ms.el = t.lru.PushFront(&ms)
		t.macs[ms.mac] = &ms
		t.total += ms.count
	}
	total, macs := t.total, len(t.macs)
	t.mu.Unlock()
	if !indexed && len(states) > 0 {
		var g errgroup.Group
		g.SetLimit(deleteParallel)
		for _, ms := range states {
			g.Go(func() error { t.save(ctx, ms, true); return nil })
		}
		_ = g.Wait() // save returns nothing: it logs its own failures
	}
	t.complete.Store(complete)
	t.log.Debug("timeline index loaded", "macs", macs, "entries", total, "from_entries", !indexed, "took", time.Since(start).String())
	t.evict(ctx, -1)
}

// scan counts the entries of every MAC, 1/256 of the key space at a time
// (by the MAC's first octet); ok is false when a read failed.
func (t *Timeline) scan(ctx context.Context) (out []macState, ok bool) {
	for b := range 256 {
		kvs, err := t.cfg.Store.List(ctx, fmt.Sprintf("%s%02x", Prefix, b))
		if err != nil {
			t.log.Warn("timeline scan failed: new MACs are counted as they appear", "err", err)
			return out, false
		}
		for _, kv := range kvs {
			mac, rest, ok := strings.Cut(strings.TrimPrefix(kv.Key, Prefix), "/")
			if !ok {
				continue
			}
			if len(out) == 0 || out[len(out)-1].mac != mac {
				out = append(out, macState{mac: mac})
			}
			ms := &out[len(out)-1]
			ms.count++
			if ns, _, ok := strings.Cut(rest, "-"); ok {
				if v, err := strconv.ParseInt(ns, 10, 64); err == nil && time.Unix(0, v).After(ms.last) {
					ms.last = time.Unix(0, v)
				}
			}
		}
	}
	return out, true
}
