// Package timeline is the boot timeline: what the boot servers, the agent
// and inventory saw of each MAC (DHCP decisions, TFTP and HTTP fetches,
// registrations, install progress), in time order, one store record per
// entry under Prefix. Recording never blocks the caller; entries are
// written by Run's writers and bounded per entry, per MAC and in total.
//
// It imports nothing of inventory: inventory composes a Timeline (and
// resolves a machine's name to its MACs for a read); the boot servers and
// the lifecycle record through their own one-method interfaces.
package timeline

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/keyrate"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The boot timeline is bounded three ways, because anything on the boot
// LAN can make entries (a DHCP packet from a spoofed MAC is one):
//
//   - per entry, at Record: source, event, detail and attributes are cut to
//     fixed sizes (made valid UTF-8 first: protobuf strings must be; and
//     their control characters escaped, internal/termsafe: a DHCP option,
//     a TFTP file name or an HTTP path is the boot LAN's to choose, and
//     the timeline is read on operators' terminals);
//   - per MAC and class (below): past Config.Limit record entries or
//     BootLAN.Limit boot-LAN entries, a MAC's oldest of that class are
//     deleted (checked every tenth of the cap's writes of that MAC);
//   - in total: past Config.MaxEntries the boot-LAN entries of the MACs
//     written to least recently are deleted first, so a flood of
//     one-packet MACs displaces itself before the history of machines that
//     keep booting, and never deletes a record entry.
//
// Two classes of entries (docs/security.md, "Timeline classes"): those
// the boot LAN causes without authenticating (sources dhcp, tftp, http and
// ra: anything on the LAN can make them, for any MAC) and the record
// (lifecycle, inventory, agent, api, bmc: registrations, refused
// registrations, install progress, operators' calls). A key ends in
// bootLANSuffix or recordSuffix by class (keys written before the classes
// had neither: the class is read from the entry's source). Boot-LAN
// entries are rate-limited per MAC and per source address at Record (the
// rest dropped and counted), have their own per-MAC cap (BootLAN.Limit),
// and are all the total's eviction deletes: a MAC left with record
// entries only is held apart from the least-recently-written order, so a
// flood, of one MAC or of many, never deletes a machine's registrations,
// its refused registrations or its operators' calls.
//
// The total needs no scan per write: an in-memory index (MAC → entries,
// last write) in least-recently-written order, loaded at Run from one
// small record per MAC under indexPrefix (a TimelineEntry whose
// "entries" attribute is the count), which is written when a MAC first
// appears and at each per-MAC trim. The counts can run a little high
// (entries another path deleted) or, after a crash, low by less than one
// trim interval per MAC; every trim and eviction lists the MAC's entries
// and corrects them. A store that has entries but no index yet (written
// before the index existed) is indexed once at Run, in 256 slices.

// Defaults of Config's limits.
const (
	DefaultLimit       = 2000
	DefaultMaxEntries  = 1_000_000
	DefaultQueue       = 65536
	DefaultDetailBytes = 4 << 10
	DefaultAttrs       = 16
	DefaultAttrBytes   = 256
	// Boot-LAN entries: kept per MAC; a MAC's and a source address's
	// burst and rate a second (a boot makes about twenty: DHCP twice,
	// TFTP, the script and two images).
	DefaultBootLANLimit       = 500
	DefaultBootLANMACBurst    = 100
	DefaultBootLANPerMAC      = 2
	DefaultBootLANSourceBurst = 400
	DefaultBootLANPerSource   = 20
	// bootLANMaxKeys bounds each table of rate limiters (MACs, sources).
	bootLANMaxKeys = 65536
)

// Key suffixes of the two classes.
const (
	bootLANSuffix = "-lan"
	recordSuffix  = "-rec"
)

// bootLANSources are the entry sources of the boot LAN's unauthenticated
// requests.
var bootLANSources = map[string]bool{"dhcp": true, "tftp": true, "http": true, "ra": true}

// BootLAN bounds the boot LAN's entries (see the top of timeline.go).
// Zero fields take the defaults.
type BootLAN struct {
	// Limit is how many boot-LAN entries are kept per MAC (default
	// DefaultBootLANLimit), apart from Config.Limit's record entries.
	Limit int
	// PerMAC entries a second after a burst of MACBurst are recorded for
	// one MAC, PerSource after SourceBurst for one source address (the
	// entry's "peer" or "src" attribute); more are dropped and counted.
	PerMAC      float64
	MACBurst    int
	PerSource   float64
	SourceBurst int
}

func (b *BootLAN) fill() {
	b.Limit = cmp.Or(max(b.Limit, 0), DefaultBootLANLimit)
	b.PerMAC = cmp.Or(max(b.PerMAC, 0), DefaultBootLANPerMAC)
	b.MACBurst = cmp.Or(max(b.MACBurst, 0), DefaultBootLANMACBurst)
	b.PerSource = cmp.Or(max(b.PerSource, 0), DefaultBootLANPerSource)
	b.SourceBurst = cmp.Or(max(b.SourceBurst, 0), DefaultBootLANSourceBurst)
}

// Prefix is the store prefix of the entries: Prefix + MAC + "/" + the
// entry's time and sequence number.
const Prefix = store.TimelinePrefix

// Config configures a Timeline. Zero values take the defaults.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Limit is how many entries are kept per MAC (default DefaultLimit).
	Limit int
	// Queue is how many entries may wait to be written before Record
	// starts dropping (default DefaultQueue, and never more than 64 MB of
	// them); drops are counted and logged.
	Queue int
	// MaxEntries bounds the entries of all MACs together (default
	// DefaultMaxEntries; at least Limit): past it the timelines of the
	// MACs written to least recently are deleted. DetailBytes, Attrs and
	// AttrBytes cap each entry (see the top of timeline.go).
	MaxEntries, DetailBytes, Attrs, AttrBytes int
	// BootLAN bounds the entries of the boot LAN's unauthenticated
	// requests.
	BootLAN BootLAN
}

const (
	// timelineQueueBytes bounds what the queued entries hold (their
	// strings, counted by entryBytes) whatever TimelineQueue is: 65,536
	// entries are ~30 MB at a storm's typical ~450 bytes, and a flood of
	// entries cut to their caps (4 KiB of detail, 16 attributes) stops
	// here instead of at ~700 MB.
	timelineQueueBytes = 64 << 20
	indexPrefix        = store.TimelineIndexPrefix
	// timelineWriters is how many entries are written concurrently; the
	// bolt store group-commits them, so a burst of boot events costs a few
	// fsyncs. A writer waits a whole commit for its one entry, so this
	// bounds entries/s to writers / commit latency: 16 drained 1,500-2,800
	// entries/s on the lab machine, under the ~1,100/s (and the index
	// records) of a 5,000-machine storm once commits slow; 128 (one
	// goroutine each, idle otherwise) drain 4,700-7,700/s
	// (BenchmarkTimelineRecord, bench/README.md "Storm").
	timelineWriters = 128
	// timelineBatch bounds the entries one writer stores in one
	// transaction (store.MaxTxnOps is the store's bound).
	timelineBatch = 64
	// evictScan bounds the MACs with entries in flight an eviction looks
	// past for one it may evict (at most timelineWriters*timelineBatch
	// entries are in flight).
	evictScan = 1024
	// maxSourceBytes and maxEventBytes cut an entry's source and event
	// names (short words in practice; an agent's progress step is one).
	maxSourceBytes = 64
	maxEventBytes  = 128
	// maxAttrKeyBytes cuts attribute names.
	maxAttrKeyBytes = 64
	// logEvery is the shortest interval between two log lines of one kind.
	logEvery = 10 * time.Second
	// deleteParallel is how many deletes of one trim or eviction are in
	// flight at once (the bolt store commits them together).
	deleteParallel = 32
)

// Timeline is the boot timeline: entries per MAC in the store, the per-MAC
// index, and the queue of entries not yet written. New makes one; Run
// writes the queue and keeps the bounds.
type Timeline struct {
	cfg     Config
	log     *slog.Logger
	queue   chan tlItem
	seq     atomic.Uint64
	dropped atomic.Uint64 // entries dropped on a full queue, ever
	queued  atomic.Int64  // entryBytes of the entries in queue

	// Boot-LAN entries over a rate, by what was over it, ever.
	limitedMAC, limitedSource atomic.Uint64
	macRate, sourceRate       *keyrate.Table

	drops, clipped, evicted, failed, limited lograte.Counter

	// stripes serialise the index work (trim, first sight, eviction) of
	// one MAC; different MACs proceed in parallel.
	stripes [64]sync.Mutex
	seed    maphash.Seed

	// complete says every MAC with entries is in the index (Run loaded
	// it): a MAC not in it has none.
	complete atomic.Bool

	mu   sync.Mutex
	macs map[string]*macState // one per MAC with entries
	lru  *list.List           // value *macState; front: written to most recently
	// held are the MACs an eviction left with record entries only (value
	// *macState): nothing of theirs is evictable until they get boot-LAN
	// entries again.
	held  *list.List
	total int // sum of the counts
}

type tlItem struct {
	key   string
	entry *inventoryv1.TimelineEntry
	size  int64         // entryBytes, counted in timeline.queued
	flush chan struct{} // a flush marker when non-nil
}

// entryBytes is roughly what a queued entry holds: its strings and a
// fixed overhead for the structures.
func entryBytes(key string, e *inventoryv1.TimelineEntry) int64 {
	n := 256 + len(key) + len(e.GetMac()) + len(e.GetSource()) + len(e.GetEvent()) + len(e.GetDetail())
	for k, v := range e.GetAttributes() {
		n += 64 + len(k) + len(v)
	}
	return int64(n)
}

// New fills cfg's defaults and returns a Timeline; Run loads its index
// and writes what Record queues.
func New(cfg Config) (*Timeline, error) {
	if cfg.Store == nil {
		return nil, errors.New("timeline: Config.Store is required")
	}
	c := &cfg
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Limit <= 0 {
		c.Limit = DefaultLimit
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	c.MaxEntries = max(c.MaxEntries, c.Limit)
	if c.Queue <= 0 {
		c.Queue = DefaultQueue
	}
	if c.DetailBytes <= 0 {
		c.DetailBytes = DefaultDetailBytes
	}
	if c.Attrs <= 0 {
		c.Attrs = DefaultAttrs
	}
	if c.AttrBytes <= 0 {
		c.AttrBytes = DefaultAttrBytes
	}
	c.BootLAN.fill()
	t := &Timeline{cfg: cfg, log: cfg.Logger, queue: make(chan tlItem, c.Queue), seed: maphash.MakeSeed(),
		macs: map[string]*macState{}, lru: list.New(), held: list.New(),
		macRate:    keyrate.New(c.BootLAN.PerMAC, c.BootLAN.MACBurst, bootLANMaxKeys),
		sourceRate: keyrate.New(c.BootLAN.PerSource, c.BootLAN.SourceBurst, bootLANMaxKeys)}
	for _, lc := range []*lograte.Counter{&t.drops, &t.clipped, &t.evicted, &t.failed, &t.limited} {
		lc.Interval = logEvery
	}
	return t, nil
}

// Record appends an entry to a MAC's boot timeline. It never blocks: the
// entry is queued for the writer started by Run, and dropped (counted, and
// logged at most once per 10 s) when the queue is full, so a packet storm
// cannot stall the boot servers. Entries with a malformed MAC are dropped.
// Fields over their caps are cut (see the top of timeline.go); the entry
// is modified in place, its attribute map is not.
func (t *Timeline) Record(e *inventoryv1.TimelineEntry) {
	mac, err := normalizeMAC(e.GetMac())
	if err != nil {
		return
	}
	e.Mac = mac
	if e.At == nil {
		e.At = timestamppb.New(t.cfg.Now())
	}
	if cut := t.clip(e); cut > 0 {
		t.clipped.Add(1, func(n int64) {
			t.log.Warn("timeline entry over its size limits: cut", "mac", mac, "source", e.GetSource(), "event", e.GetEvent(),
				"bytes_cut", cut, "detail_limit", t.cfg.DetailBytes, "attrs_limit", t.cfg.Attrs,
				"attr_bytes_limit", t.cfg.AttrBytes, "entries_cut_since_last_log", n)
		})
	}
	lan := bootLANSources[e.GetSource()]
	if lan && !t.allowBootLAN(e) {
		return
	}
	suffix := recordSuffix
	if lan {
		suffix = bootLANSuffix
	}
	key := fmt.Sprintf("%s%s/%020d-%010d%s", Prefix, mac, e.GetAt().AsTime().UnixNano(), t.seq.Add(1), suffix)
	size := entryBytes(key, e)
	queued := false
	if t.queued.Add(size) <= timelineQueueBytes {
		select {
		case t.queue <- tlItem{key: key, entry: e, size: size}:
			queued = true
		default:
		}
	}
	if !queued {
		t.queued.Add(-size)
		t.dropped.Add(1)
		t.drops.Add(1, func(n int64) {
			t.log.Warn("timeline queue full: entries dropped", "queue", t.cfg.Queue, "dropped_since_last_log", n, "dropped_total", t.dropped.Load())
		})
	}
}

// allowBootLAN takes a token of the entry's MAC and of its source
// address (its "peer" or "src" attribute, when it has one), or counts and
// logs it as dropped.
func (t *Timeline) allowBootLAN(e *inventoryv1.TimelineEntry) bool {
	now := t.cfg.Now()
	src := cmp.Or(e.GetAttributes()["peer"], e.GetAttributes()["src"])
	by := ""
	switch {
	case src != "" && !t.sourceRate.Allow(src, now):
		by = "source"
		t.limitedSource.Add(1)
	case !t.macRate.Allow(e.GetMac(), now):
		by = "mac"
		t.limitedMAC.Add(1)
	default:
		return true
	}
	t.limited.Add(1, func(n int64) {
		b := t.cfg.BootLAN
		t.log.Warn("timeline: boot-LAN entries over their rate: dropped", "mac", e.GetMac(), "peer", src, "source", e.GetSource(),
			"event", e.GetEvent(), "limited_by", by, "per_mac_rate", b.PerMAC, "per_mac_burst", b.MACBurst,
			"per_source_rate", b.PerSource, "per_source_burst", b.SourceBurst, "dropped_since_last_log", n)
	})
	return false
}

// Limited is how many boot-LAN entries were dropped over the per-MAC and
// over the per-source rate, ever.
func (t *Timeline) Limited() (byMAC, bySource uint64) {
	return t.limitedMAC.Load(), t.limitedSource.Load()
}

// Event is a convenience for Record.
func (t *Timeline) Event(mac, source, event, detail string, attrs map[string]string) {
	t.Record(&inventoryv1.TimelineEntry{Mac: mac, Source: source, Event: event, Detail: detail, Attributes: attrs})
}

// clip cuts e's strings to their caps and returns how many bytes it cut.
func (t *Timeline) clip(e *inventoryv1.TimelineEntry) int {
	c := t.cfg
	cut := 0
	clipTo := func(s string, n int) string {
		v := clipString(s, n)
		cut += max(0, len(s)-len(v))
		return v
	}
	e.Source = clipTo(e.GetSource(), maxSourceBytes)
	e.Event = clipTo(e.GetEvent(), maxEventBytes)
	e.Detail = clipTo(e.GetDetail(), c.DetailBytes)
	attrs := e.GetAttributes()
	over := len(attrs) > c.Attrs
	for k, v := range attrs {
		if over || len(k) > maxAttrKeyBytes || len(v) > c.AttrBytes || termsafe.Has(k) || termsafe.Has(v) {
			over = true
			break
		}
	}
	if !over {
		return cut
	}
	// Keep the first keys in order, leaving room to say how many went.
	keys := slices.Sorted(maps.Keys(attrs))
	out := make(map[string]string, min(len(keys), c.Attrs))
	keep := keys
	if len(keys) > c.Attrs {
		keep = keys[:c.Attrs-1]
		for _, k := range keys[len(keep):] {
			cut += len(k) + len(attrs[k])
		}
		out["attrs_cut"] = strconv.Itoa(len(keys) - len(keep))
	}
	for _, k := range keep {
		out[clipTo(k, maxAttrKeyBytes)] = clipTo(attrs[k], c.AttrBytes)
	}
	e.Attributes = out
	return cut
}

// clipMark ends a string that was cut.
const clipMark = "…[cut]"

// clipString makes s valid UTF-8 without control characters (escaped) and
// cuts it to at most n bytes on a rune boundary, ending with clipMark when
// it was cut.
func clipString(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	s = termsafe.Escape(s)
	if len(s) <= n {
		return s
	}
	mark := clipMark
	if n < 2*len(mark) {
		mark = ""
	}
	end := n - len(mark)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + mark
}

// Flush waits until every entry recorded before the call is written (or
// ctx ends). Run must be running.
func (t *Timeline) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case t.queue <- tlItem{flush: done}:
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

// Dropped is how many entries were dropped on a full queue, ever.
func (t *Timeline) Dropped() uint64 { return t.dropped.Load() }

// Run loads the index, then writes queued entries until ctx ends, and
// writes what is still queued before it returns nil.
//
// Entries that queued up while the writers were busy go out together:
// the dispatcher hands a writer everything waiting, up to timelineBatch
// entries, and the writer stores them in one transaction. A quiet
// appliance writes each entry alone as before; under a boot storm the
// store sees a few large commits instead of one per entry, which is what
// etcd (one raft proposal per write) needs (bench/README.md, "Fleet storm
// on etcd").
func (t *Timeline) Run(ctx context.Context) error {
	t.load(ctx)
	var wg sync.WaitGroup
	// Writers stop on a closed channel, which is only closed after ctx
	// ends and the queue is drained into it.
	work := make(chan []queuedWrite)
	var inflight sync.WaitGroup
	for range timelineWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				t.writeBatch(context.WithoutCancel(ctx), batch)
				inflight.Add(-len(batch))
			}
		}()
	}
	var batch []queuedWrite
	send := func() {
		if len(batch) > 0 {
			inflight.Add(len(batch))
			work <- batch
			batch = nil
		}
	}
	// take adds it to the batch; a flush first sends what is collected
	// and waits for every write before it.
	take := func(it tlItem) {
		t.queued.Add(-it.size)
		if it.flush != nil {
			send()
			inflight.Wait()
			close(it.flush)
			return
		}
		// Registered here, in the order entries were queued, so that
		// the least-recently-written order is that of arrival whichever
		// writer stores them first.
		batch = append(batch, queuedWrite{it: it, pw: t.pending(it)})
		if len(batch) == timelineBatch {
			send()
		}
	}
	// more takes what else is queued now, without waiting.
	more := func() {
		for len(batch) > 0 && len(batch) < timelineBatch {
			select {
			case it := <-t.queue:
				take(it)
			default:
				return
			}
		}
	}
	for {
		select {
		case it := <-t.queue:
			take(it)
			more()
			send()
		case <-ctx.Done():
			for {
				select {
				case it := <-t.queue:
					take(it)
				default:
					send()
					close(work)
					wg.Wait()
					t.saveAll(context.WithoutCancel(ctx))
					return nil
				}
			}
		}
	}
}

// writeBatch stores a batch of entries: one entry with Put, more in one
// transaction (a transaction refused as a whole — a key already there —
// falls back to one Put each, so one bad entry costs only itself).
func (t *Timeline) writeBatch(ctx context.Context, batch []queuedWrite) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	errs := make([]error, len(batch))
	if len(batch) == 1 {
		_, errs[0] = record.Put(ctx, t.cfg.Store, batch[0].it.key, batch[0].it.entry, 0)
	} else {
		ops := make([]store.Op, 0, len(batch))
		var err error
		for _, q := range batch {
			var b []byte
			if b, err = record.Marshal(q.it.entry); err != nil {
				break
			}
			ops = append(ops, store.Op{Kind: store.OpPut, Key: q.it.key, Value: b})
		}
		if err == nil {
			_, err = t.cfg.Store.Txn(ctx, ops)
		}
		if err != nil {
			for n, q := range batch {
				_, errs[n] = record.Put(ctx, t.cfg.Store, q.it.key, q.it.entry, 0)
			}
		}
	}
	for n, q := range batch {
		t.written(ctx, q.it, q.pw, errs[n])
	}
}

// pendingWrite is what pending noted of an entry before it was stored.
type pendingWrite struct {
	ms    *macState
	known bool
}

// queuedWrite is an entry handed to a writer, registered as pending.
type queuedWrite struct {
	it tlItem
	pw pendingWrite
}

// pending registers the entry as pending before it is stored, so that a
// trim listing the MAC meanwhile counts it (and marks it counted) exactly
// once. Writes of one MAC run in parallel.
func (t *Timeline) pending(it tlItem) pendingWrite {
	mac := it.entry.GetMac()
	t.mu.Lock()
	defer t.mu.Unlock()
	ms, known := t.macs[mac]
	switch {
	case !known:
		ms = t.push(mac)
	case !ms.held:
		// Its place in the least-recently-written order is taken here,
		// in the order entries were queued, not when a batch written
		// concurrently with others gets counted.
		t.lru.MoveToFront(ms.el)
	}
	ms.pending[it.key] = false
	return pendingWrite{ms: ms, known: known}
}

// written accounts for one entry stored (err nil) or not: it keeps the
// MAC's index entry, trims the MAC when it is due, and evicts least
// recently written MACs while over the total.
func (t *Timeline) written(ctx context.Context, it tlItem, pw pendingWrite, err error) {
	mac := it.entry.GetMac()
	ms, known := pw.ms, pw.known
	st := t.stripe(mac)
	st.Lock()
	t.mu.Lock()
	counted := ms.pending[it.key]
	delete(ms.pending, it.key)
	if err != nil {
		t.mu.Unlock()
		st.Unlock()
		t.failed.Add(1, func(n int64) {
			t.log.Warn("timeline write failed", "mac", mac, "err", err, "failed_since_last_log", n)
		})
		return
	}
	switch cur, ok := t.macs[mac]; {
	case !ok:
		// Evicted while the entry was stored: the MAC starts over.
		ms, known, counted = t.push(mac), false, false
	case cur != ms:
		// Evicted and held again (its record entries) meanwhile.
		ms, counted = cur, false
	}
	lan := strings.HasSuffix(it.key, bootLANSuffix)
	if ms.held && lan {
		// Evictable again (the MAC's boot-LAN entries are).
		t.held.Remove(ms.el)
		ms.el, ms.held = t.lru.PushFront(ms), false
	}
	if !counted {
		ms.count++
		t.total++
	}
	ms.since++
	if lan {
		ms.lanSince++
	}
	if at := it.entry.GetAt().AsTime(); at.After(ms.last) {
		ms.last = at
	}
	// A MAC seen for the first time gets its index record; it holds no
	// other entry when the index is complete, else it is counted. Each
	// class is trimmed every tenth of its cap.
	resync := !known && !t.complete.Load() || ms.since-ms.lanSince >= t.cfg.Limit/10+1 || ms.lanSince >= t.cfg.BootLAN.Limit/10+1
	snap := ms.snapshot()
	t.mu.Unlock()
	switch {
	case resync:
		t.resync(ctx, ms)
	case !known:
		t.save(ctx, snap, true)
	}
	st.Unlock()
	t.evict(ctx, 4)
}

// Entries returns the newest limit entries (oldest first) of macs
// (normalised MACs, as Record stores them). limit <= 0 means 200.
func (t *Timeline) Entries(ctx context.Context, macs []string, limit int) ([]*inventoryv1.TimelineEntry, error) {
	if limit <= 0 {
		limit = 200
	}
	var out []*inventoryv1.TimelineEntry
	for _, mac := range macs {
		es, err := record.List(ctx, t.cfg.Store, Prefix+mac+"/", func() *inventoryv1.TimelineEntry { return &inventoryv1.TimelineEntry{} })
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

// normalizeMAC is a 6-byte MAC lower-case and colon-separated, as entries
// are keyed (inventory.NormalizeMAC's form).
func normalizeMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("timeline: %q is not a 6-byte MAC address", s)
	}
	return hw.String(), nil
}
