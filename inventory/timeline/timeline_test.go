package timeline

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

func TestTimelineEntryCaps(t *testing.T) {
	tl, err := New(Config{Store: mem.New(), DetailBytes: 32, Attrs: 3, AttrBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 100)
	for name, tc := range map[string]struct {
		in, want *inventoryv1.TimelineEntry
	}{
		"within the caps": {
			in:   &inventoryv1.TimelineEntry{Source: "dhcp", Event: "discover", Detail: "DISCOVER", Attributes: map[string]string{"a": "1"}},
			want: &inventoryv1.TimelineEntry{Source: "dhcp", Event: "discover", Detail: "DISCOVER", Attributes: map[string]string{"a": "1"}},
		},
		"long detail": {
			in:   &inventoryv1.TimelineEntry{Detail: long},
			want: &inventoryv1.TimelineEntry{Detail: strings.Repeat("x", 32-len(clipMark)) + clipMark},
		},
		"detail cut on a rune boundary": {
			in:   &inventoryv1.TimelineEntry{Detail: strings.Repeat("é", 40)}, // 2 bytes each
			want: &inventoryv1.TimelineEntry{Detail: strings.Repeat("é", 12) + clipMark},
		},
		"invalid UTF-8 made valid": {
			in:   &inventoryv1.TimelineEntry{Detail: "host\xffname", Attributes: map[string]string{"hostname": "a\xfeb"}},
			want: &inventoryv1.TimelineEntry{Detail: "host\uFFFDname", Attributes: map[string]string{"hostname": "a\uFFFDb"}},
		},
		"control characters escaped": {
			in: &inventoryv1.TimelineEntry{Event: "progress: \x1b[2J", Detail: "\x1b]0;t\x07\u202e",
				Attributes: map[string]string{"vendor_class": "\x1b]52;c;eA==\x07", "k\u009b": "v"}},
			want: &inventoryv1.TimelineEntry{Event: `progress: \x1b[2J`, Detail: `\x1b]0;t\x07\u202e`,
				Attributes: map[string]string{"vendor_class": `\x1b]52;…[cut]`, `k\u009b`: "v"}},
		},
		"long source, event and step": {
			in:   &inventoryv1.TimelineEntry{Source: long, Event: "progress: " + long + long},
			want: &inventoryv1.TimelineEntry{Source: long[:maxSourceBytes-len(clipMark)] + clipMark, Event: ("progress: " + long + long)[:maxEventBytes-len(clipMark)] + clipMark},
		},
		"too many attributes": {
			in:   &inventoryv1.TimelineEntry{Attributes: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}},
			want: &inventoryv1.TimelineEntry{Attributes: map[string]string{"a": "1", "b": "2", "attrs_cut": "3"}},
		},
		"long attribute value and key": {
			in: &inventoryv1.TimelineEntry{Attributes: map[string]string{"path": long, long: "v"}},
			want: &inventoryv1.TimelineEntry{Attributes: map[string]string{"path": strings.Repeat("x", 16-len(clipMark)) + clipMark,
				strings.Repeat("x", maxAttrKeyBytes-len(clipMark)) + clipMark: "v"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			attrs := tc.in.Attributes
			before := fmt.Sprint(attrs)
			tl.clip(tc.in)
			if diff := cmp.Diff(tc.want, tc.in, protocmp.Transform()); diff != "" {
				t.Errorf("clipped entry (-want +got):\n%s", diff)
			}
			if fmt.Sprint(attrs) != before {
				t.Error("the caller's attribute map was modified")
			}
			if _, err := record.Marshal(tc.in); err != nil {
				t.Errorf("the clipped entry does not encode: %v", err)
			}
		})
	}
}

// flood records n entries for each MAC, flushing after each MAC so that
// the least recently written order is the order of macs.
func flood(t *testing.T, tl *Timeline, n int, macs ...string) {
	t.Helper()
	for _, mac := range macs {
		for k := range n {
			tl.Event(mac, "dhcp", "discover", fmt.Sprint(k), nil)
		}
		if err := tl.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// stored counts entries in the store by MAC.
func stored(t *testing.T, s store.Store) map[string]int {
	t.Helper()
	kvs, err := s.List(context.Background(), Prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, kv := range kvs {
		mac, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, Prefix), "/")
		out[mac]++
	}
	return out
}

func mac(n int) string { return fmt.Sprintf("52:54:00:00:%02x:%02x", n>>8, n&0xff) }

// TestTimelineTotalCap: past the total, the MACs written to least
// recently lose their timelines first; the ones still booting keep
// theirs; a log line says so.
func TestTimelineTotalCap(t *testing.T) {
	logs := &syncbuf.Buffer{}
	st := mem.New()
	tl := newTL(t, Config{Store: st, Limit: 20, MaxEntries: 50, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	flood(t, tl, 10, mac(1), mac(2), mac(3), mac(4), mac(5), mac(6), mac(7), mac(8))
	want := map[string]int{mac(4): 10, mac(5): 10, mac(6): 10, mac(7): 10, mac(8): 10}
	if diff := cmp.Diff(want, stored(t, st)); diff != "" {
		t.Errorf("entries by MAC (-want +got):\n%s", diff)
	}
	// mac(4) boots again: it is now the newest, so mac(5) goes; mac(9)'s
	// five fit.
	flood(t, tl, 5, mac(4), mac(9))
	want = map[string]int{mac(4): 15, mac(6): 10, mac(7): 10, mac(8): 10, mac(9): 5}
	if diff := cmp.Diff(want, stored(t, st)); diff != "" {
		t.Errorf("entries by MAC after mac(4) booted again (-want +got):\n%s", diff)
	}
	if !strings.Contains(logs.String(), "timeline over its total limit") {
		t.Errorf("no log line for the eviction:\n%s", logs)
	}
}

// TestTimelineSpoofedMACFlood: one entry from each of many spoofed MACs
// keeps the store and the in-memory index within the total.
func TestTimelineSpoofedMACFlood(t *testing.T) {
	st := mem.New()
	tl := newTL(t, Config{Store: st, Limit: 100, MaxEntries: 300})
	flood(t, tl, 50, mac(0)) // a real machine, booted before the flood...
	for n := 1; n <= 3000; n++ {
		tl.Event(mac(n), "dhcp", "ignored", "spoofed", nil)
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := stored(t, st)
	total := 0
	for _, n := range got {
		total += n
	}
	if total > 300 {
		t.Errorf("%d entries stored, limit 300", total)
	}
	tl.mu.Lock()
	macs, lru := len(tl.macs), tl.lru.Len()
	tl.mu.Unlock()
	if macs > 300 || macs != lru {
		t.Errorf("index holds %d MACs (list %d), limit 300", macs, lru)
	}
	if got[mac(3000)] != 1 {
		t.Errorf("the newest MAC lost its entry")
	}
	t.Logf("%d entries of %d MACs stored after 3000 spoofed MACs", total, len(got))
}

// TestTimelineIndexSurvivesRestart: the counts written at shutdown are
// what the next Run starts from; a lower total applies at once.
func TestTimelineIndexSurvivesRestart(t *testing.T) {
	st := mem.New()
	run := func(cfg Config) (*Timeline, func()) {
		cfg.Store = st
		tl, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tl.Run(ctx) }()
		return tl, func() { cancel(); <-done }
	}
	tl, stop := run(Config{Limit: 100})
	flood(t, tl, 7, mac(1), mac(2), mac(3))
	stop()
	tl, stop = run(Config{Limit: 10, MaxEntries: 15})
	defer stop()
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{mac(2): 7, mac(3): 7}, stored(t, st)); diff != "" {
		t.Errorf("entries after a restart with a lower total (-want +got):\n%s", diff)
	}
	tl.mu.Lock()
	total := tl.total
	tl.mu.Unlock()
	if total != 14 {
		t.Errorf("index total %d, want 14", total)
	}
}

// TestTimelineIndexBuiltFromEntries: entries written before the index
// existed are counted once at Run, and the index records written.
func TestTimelineIndexBuiltFromEntries(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	at := time.Unix(1_800_000_000, 0)
	for m := 1; m <= 4; m++ {
		for k := range 5 {
			at = at.Add(time.Second)
			e := &inventoryv1.TimelineEntry{Mac: mac(m), At: timestampAt(at), Source: "dhcp", Event: "discover"}
			key := fmt.Sprintf("%s%s/%020d-%010d", Prefix, mac(m), at.UnixNano(), k)
			if _, err := record.Put(ctx, st, key, e, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	tl := newTL(t, Config{Store: st, Limit: 10, MaxEntries: 12})
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{mac(3): 5, mac(4): 5}, stored(t, st)); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	idx, err := st.List(ctx, indexPrefix)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range idx {
		keys = append(keys, strings.TrimPrefix(kv.Key, indexPrefix))
	}
	if diff := cmp.Diff([]string{mac(3), mac(4)}, keys); diff != "" {
		t.Errorf("index records (-want +got):\n%s", diff)
	}
}

// TestTimelineDropsLogged: a full queue drops, counts and logs, at most
// once per interval.
func TestTimelineDropsLogged(t *testing.T) {
	logs := &syncbuf.Buffer{}
	// The boot LAN's rate per MAC is set above the flood: this is about
	// the queue.
	tl, err := New(Config{Store: mem.New(), Queue: 4, Logger: slog.New(slog.NewTextHandler(logs, nil)), BootLAN: BootLAN{MACBurst: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		tl.Event(mac(1), "dhcp", "discover", "", nil)
	}
	if n := strings.Count(logs.String(), "timeline queue full"); n != 1 {
		t.Errorf("%d log lines for 996 drops, want 1:\n%s", n, logs)
	}
	if tl.dropped.Load() != 996 {
		t.Errorf("dropped %d, want 996", tl.dropped.Load())
	}
}

// TestTimelineQueueBytes: whatever the entry count allows, the queue holds
// at most timelineQueueBytes of entries; the rest are dropped, and what a
// writer takes off the queue is free again.
func TestTimelineQueueBytes(t *testing.T) {
	tl, err := New(Config{Store: mem.New()})
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{}
	for i := range DefaultAttrs {
		attrs[fmt.Sprintf("attr%02d", i)] = strings.Repeat("v", DefaultAttrBytes)
	}
	detail := strings.Repeat("d", DefaultDetailBytes)
	const n = 20000 // fits TimelineQueue, not the bytes
	for range n {
		tl.Event(mac(1), "agent", "progress", detail, attrs)
	}
	queued, dropped := tl.queued.Load(), tl.dropped.Load()
	if queued > timelineQueueBytes || dropped == 0 || int(dropped)+len(tl.queue) != n {
		t.Fatalf("queued %d bytes (limit %d) in %d entries, dropped %d of %d", queued, timelineQueueBytes, len(tl.queue), dropped, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if q := tl.queued.Load(); q != 0 {
		t.Errorf("%d bytes still counted as queued after the flush", q)
	}
}

func timestampAt(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// TestTimelineIndexTwoAppliances: two appliances (two Timelines on one
// store) record events of one MAC at once; both write its index record,
// and their concurrent writes are retried, not lost with a warning.
func TestTimelineIndexTwoAppliances(t *testing.T) {
	st := mem.New()
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tls []*Timeline
	for range 2 {
		tl, err := New(Config{Store: st, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		go tl.Run(ctx)
		tls = append(tls, tl)
	}
	var wg sync.WaitGroup
	for _, tl := range tls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				tl.Event(mac(1), "dhcp", "discover", strconv.Itoa(i), nil)
				if i%20 == 0 {
					if err := tl.Flush(ctx); err != nil {
						t.Error(err)
					}
				}
			}
			if err := tl.Flush(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if strings.Contains(logs.String(), "timeline index write failed") {
		t.Fatalf("index writes lost to the other appliance's:\n%s", logs)
	}
	if _, err := st.Get(ctx, indexPrefix+mac(1)); err != nil {
		t.Fatalf("index record: %v", err)
	}
}

func newTL(t *testing.T, cfg Config) *Timeline {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = mem.New()
	}
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return tl
}

// slowStore takes each write a while (as etcd's consensus does) and
// counts the write calls.
type slowStore struct {
	store.Store
	mu            sync.Mutex
	puts, txns    int
	txnOps, delay int
}

func (s *slowStore) Put(ctx context.Context, key string, v []byte, rev int64) (int64, error) {
	s.mu.Lock()
	s.puts++
	s.mu.Unlock()
	time.Sleep(time.Duration(s.delay) * time.Millisecond)
	return s.Store.Put(ctx, key, v, rev)
}

func (s *slowStore) Txn(ctx context.Context, ops []store.Op) (int64, error) {
	s.mu.Lock()
	s.txns++
	s.txnOps += len(ops)
	s.mu.Unlock()
	time.Sleep(time.Duration(s.delay) * time.Millisecond)
	return s.Store.Txn(ctx, ops)
}

// TestTimelineBatchesABacklog: entries that queue up while the store is
// slow go out many to a transaction, not one write each; every entry is
// stored and counted once, and each MAC keeps its order of arrival for
// eviction.
func TestTimelineBatchesABacklog(t *testing.T) {
	st := &slowStore{Store: mem.New(), delay: 20}
	tl := newTL(t, Config{Store: st, Limit: 1000, MaxEntries: 100_000})
	const macs, each = 400, 10
	for i := range each {
		for n := range macs {
			tl.Event(mac(n), "dhcp", "discover", strconv.Itoa(i), nil)
		}
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := stored(t, st.Store)
	for n := range macs {
		if got[mac(n)] != each {
			t.Fatalf("%s: %d entries stored, want %d", mac(n), got[mac(n)], each)
		}
	}
	st.mu.Lock()
	puts, txns, txnOps := st.puts, st.txns, st.txnOps
	st.mu.Unlock()
	// Index records are Puts of their own (one per new MAC); the entries
	// went mostly in transactions.
	if entryPuts := puts - macs; txnOps < macs*each/2 || txns > macs*each/8 {
		t.Errorf("%d entries: %d transactions carrying %d, %d single puts; want most in few transactions", macs*each, txns, txnOps, entryPuts)
	}
	tl.mu.Lock()
	total := tl.total
	tl.mu.Unlock()
	if total != macs*each {
		t.Errorf("index counts %d entries, want %d", total, macs*each)
	}
	t.Logf("%d entries: %d transactions (%d entries), %d puts (index records included)", macs*each, txns, txnOps, puts)
}
