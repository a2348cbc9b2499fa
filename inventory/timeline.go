package inventory

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// timelineWriters is how many entries are written concurrently; the bolt
// store group-commits them, so a burst of boot events costs a few fsyncs.
const timelineWriters = 16

type timeline struct {
	inv     *Inventory
	queue   chan tlItem
	seq     atomic.Uint64
	dropped atomic.Uint64
	mu      sync.Mutex
	since   map[string]int // entries written per MAC since its last trim
}

type tlItem struct {
	key   string
	entry *inventoryv1.TimelineEntry
	flush chan struct{} // a flush marker when non-nil
}

func newTimeline(inv *Inventory) *timeline {
	return &timeline{inv: inv, queue: make(chan tlItem, inv.cfg.TimelineQueue), since: map[string]int{}}
}

// Record appends an entry to a MAC's boot timeline. It never blocks: the
// entry is queued for the writer started by Run, and dropped (counted, and
// logged once per 1000) when the queue is full, so a packet storm cannot
// stall the boot servers. Entries with a malformed MAC are dropped.
func (i *Inventory) Record(e *inventoryv1.TimelineEntry) {
	mac, err := NormalizeMAC(e.GetMac())
	if err != nil {
		return
	}
	e.Mac = mac
	if e.At == nil {
		e.At = timestamppb.New(i.cfg.Now())
	}
	t := i.tl
	key := fmt.Sprintf("%s%s/%020d-%010d", timelinePrefix, mac, e.GetAt().AsTime().UnixNano(), t.seq.Add(1))
	select {
	case t.queue <- tlItem{key: key, entry: e}:
	default:
		if n := t.dropped.Add(1); n%1000 == 1 {
			i.log.Warn("timeline queue full: dropping entries", "dropped_total", n)
		}
	}
}

// Event is a convenience for Record.
func (i *Inventory) Event(mac, source, event, detail string, attrs map[string]string) {
	i.Record(&inventoryv1.TimelineEntry{Mac: mac, Source: source, Event: event, Detail: detail, Attributes: attrs})
}

// FlushTimeline waits until every entry recorded before the call is
// written (or ctx ends). Run must be running.
func (i *Inventory) FlushTimeline(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case i.tl.queue <- tlItem{flush: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *timeline) run(ctx context.Context) error {
	var wg sync.WaitGroup
	// Writers stop on a closed channel, which is only closed after ctx
	// ends and the queue is drained into it.
	work := make(chan tlItem)
	var inflight sync.WaitGroup
	for range timelineWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				t.write(context.WithoutCancel(ctx), it)
				inflight.Done()
			}
		}()
	}
	dispatch := func(it tlItem) {
		if it.flush != nil {
			inflight.Wait()
			close(it.flush)
			return
		}
		inflight.Add(1)
		work <- it
	}
	for {
		select {
		case it := <-t.queue:
			dispatch(it)
		case <-ctx.Done():
			for {
				select {
				case it := <-t.queue:
					dispatch(it)
				default:
					close(work)
					wg.Wait()
					return nil
				}
			}
		}
	}
}

func (t *timeline) write(ctx context.Context, it tlItem) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := record.Put(ctx, t.inv.cfg.Store, it.key, it.entry, 0); err != nil {
		t.inv.log.Warn("timeline write failed", "mac", it.entry.GetMac(), "err", err)
		return
	}
	mac := it.entry.GetMac()
	limit := t.inv.cfg.TimelineLimit
	t.mu.Lock()
	t.since[mac]++
	trim := t.since[mac] >= limit/10+1
	if trim {
		t.since[mac] = 0
	}
	t.mu.Unlock()
	if trim {
		t.trim(ctx, mac, limit)
	}
}

// trim deletes a MAC's oldest entries beyond limit.
func (t *timeline) trim(ctx context.Context, mac string, limit int) {
	kvs, err := t.inv.cfg.Store.List(ctx, timelinePrefix+mac+"/")
	if err != nil {
		return
	}
	for _, kv := range kvs[:max(0, len(kvs)-limit)] {
		_ = t.inv.cfg.Store.Delete(ctx, kv.Key, kv.Revision)
	}
}

// Timeline returns the newest limit entries (oldest first) for a MAC, or
// for every MAC of a named machine. limit <= 0 means 200.
func (i *Inventory) Timeline(ctx context.Context, name, mac string, limit int) ([]*inventoryv1.TimelineEntry, error) {
	if limit <= 0 {
		limit = 200
	}
	var macs []string
	switch {
	case mac != "":
		m, err := NormalizeMAC(mac)
		if err != nil {
			return nil, err
		}
		macs = []string{m}
	case name != "":
		m, err := i.GetMachine(ctx, name)
		if err != nil {
			return nil, err
		}
		macs = m.GetMacs()
	default:
		return nil, invalidf("timeline: a machine name or a MAC is required")
	}
	var out []*inventoryv1.TimelineEntry
	for _, mac := range macs {
		es, err := record.List(ctx, i.cfg.Store, timelinePrefix+mac+"/", func() *inventoryv1.TimelineEntry { return &inventoryv1.TimelineEntry{} })
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].GetAt().AsTime().Before(out[b].GetAt().AsTime()) })
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
