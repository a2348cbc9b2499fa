package metrics

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/prometheus/client_golang/prometheus"
)

// Key prefixes of the records counted (inventory/machines.go and
// inventory/pool/pool.go own them; read by prefix here, not imported).
const (
	machinesPrefix = store.MachinesPrefix
	nodesPrefix    = store.NodesPrefix
)

// maxCounted bounds each in-memory state table: far above one appliance's
// design load (5,000 machines); past it, new records are left uncounted
// and corral_state_count_overflow says so.
const maxCounted = 1 << 20

// stateCounts keeps the number of machines by state and nodes by
// readiness, following the store: a read of each prefix a page at a time
// (load), then every change after the first page's revision
// (store.HistoryWatcher; a store without history: Watch started before
// the read, an event older than the record read ignored). A watch the store cuts (a slow watcher) resumes after
// the last change applied. A scrape reads the counts from memory: its cost
// does not grow with the fleet.
type stateCounts struct {
	log      *slog.Logger
	machines *stateTable
	nodes    *stateTable

	machinesDesc, nodesDesc, overflowDesc, syncedDesc *prometheus.Desc
}

func newStateCounts(log *slog.Logger) *stateCounts {
	machineStates := []string{}
	for v := range inventoryv1.Machine_MachineState_name {
		machineStates = append(machineStates, inventoryv1.Machine_MachineState(v).String())
	}
	nodeStates := []string{}
	for v := range poolv1.Node_NodeState_name {
		nodeStates = append(nodeStates, poolv1.Node_NodeState(v).String())
	}
	return &stateCounts{
		log: log,
		machines: newStateTable(machinesPrefix, machineStates, func(b []byte) (string, bool) {
			var m inventoryv1.Machine
			if record.Unmarshal(b, &m) != nil {
				return "", false
			}
			return m.GetState().String(), true
		}),
		nodes: newStateTable(nodesPrefix, nodeStates, func(b []byte) (string, bool) {
			var n poolv1.Node
			if record.Unmarshal(b, &n) != nil {
				return "", false
			}
			return n.GetState().String(), true
		}),
		machinesDesc: prometheus.NewDesc("corral_machines", "Machines by lifecycle state.", []string{"state"}, nil),
		nodesDesc:    prometheus.NewDesc("corral_nodes", "Pool nodes by readiness (READY, NOT_READY).", []string{"state"}, nil),
		overflowDesc: prometheus.NewDesc("corral_state_count_overflow", "1 when more records exist than the counts keep (machines or nodes left uncounted).", []string{"kind"}, nil),
		syncedDesc:   prometheus.NewDesc("corral_state_count_synced", "1 once the counts follow the store (0 before the first List or while a watch is restarted).", []string{"kind"}, nil),
	}
}

func (c *stateCounts) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.machinesDesc
	ch <- c.nodesDesc
	ch <- c.overflowDesc
	ch <- c.syncedDesc
}

func (c *stateCounts) Collect(ch chan<- prometheus.Metric) {
	for _, t := range []struct {
		kind string
		tab  *stateTable
		desc *prometheus.Desc
	}{{"machines", c.machines, c.machinesDesc}, {"nodes", c.nodes, c.nodesDesc}} {
		counts, overflow, synced := t.tab.snapshot()
		for state, n := range counts {
			ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, float64(n), state)
		}
		ch <- prometheus.MustNewConstMetric(c.overflowDesc, prometheus.GaugeValue, b2f(overflow), t.kind)
		ch <- prometheus.MustNewConstMetric(c.syncedDesc, prometheus.GaugeValue, b2f(synced), t.kind)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// run follows both prefixes until ctx ends.
func (c *stateCounts) run(ctx context.Context, st store.Store) error {
	var wg sync.WaitGroup
	for _, t := range []*stateTable{c.machines, c.nodes} {
		wg.Add(1)
		go func() { defer wg.Done(); t.follow(ctx, st, c.log) }()
	}
	wg.Wait()
	return nil
}

// stateTable is one prefix's records' states.
type stateTable struct {
	prefix string
	states []string // every state name, so zero counts are exported
	decode func([]byte) (state string, ok bool)

	mu       sync.Mutex
	recs     map[string]counted
	counts   map[string]int
	overflow bool
	synced   bool
	// lastRev is the newest revision applied (follow's goroutine only):
	// a cut watch resumes after it when the store keeps history.
	lastRev int64
}

type counted struct {
	rev   int64
	state string
}

func newStateTable(prefix string, states []string, decode func([]byte) (string, bool)) *stateTable {
	return &stateTable{prefix: prefix, states: states, decode: decode, recs: map[string]counted{}, counts: map[string]int{}}
}

func (t *stateTable) snapshot() (counts map[string]int, overflow, synced bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	counts = make(map[string]int, len(t.states))
	for _, s := range t.states {
		counts[s] = 0
	}
	for s, n := range t.counts {
		counts[s] = n
	}
	return counts, t.overflow, t.synced
}

// apply records a put (value != nil) or delete of key at rev, unless the
// table holds a newer revision of it.
func (t *stateTable) apply(key string, value []byte, rev int64) {
	// Sub-records under the prefix (none today) are not objects.
	if strings.Contains(strings.TrimPrefix(key, t.prefix), "/") {
		return
	}
	state, ok := "", false
	if value != nil {
		if state, ok = t.decode(value); !ok {
			state = "undecodable"
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, had := t.recs[key]
	if had && cur.rev >= rev {
		return
	}
	if had {
		t.counts[cur.state]--
		if t.counts[cur.state] <= 0 {
			delete(t.counts, cur.state)
		}
	}
	if value == nil {
		delete(t.recs, key)
		return
	}
	if !had && len(t.recs) >= maxCounted {
		t.overflow = true
		return
	}
	t.recs[key] = counted{rev: rev, state: state}
	t.counts[state]++
}

// reset empties the table before a fresh List.
func (t *stateTable) reset(synced bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !synced {
		t.synced = false
		return
	}
	clear(t.recs)
	clear(t.counts)
	t.overflow = false
}

// follow lists and watches the prefix until ctx ends. When the watch ends
// early (the store cuts a watcher that falls behind) it resumes after the
// last revision applied (store.HistoryWatcher), or lists again when the
// store no longer has that history, after a pause that doubles up to a
// minute while restarts keep failing.
func (t *stateTable) follow(ctx context.Context, st store.Store, log *slog.Logger) {
	pause := time.Second
	for ctx.Err() == nil {
		started := time.Now()
		err := t.once(ctx, st)
		if ctx.Err() != nil {
			return
		}
		t.reset(false)
		if time.Since(started) > time.Minute {
			pause = time.Second
		}
		log.Warn("state counts: watch ended; listing again", "prefix", t.prefix, "err", err, "retry_in", pause.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Minute)
	}
}

func (t *stateTable) once(ctx context.Context, st store.Store) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hw, ok := store.AsHistoryWatcher(st)
	if !ok {
		return t.relist(ctx, wctx, st)
	}
	var ch <-chan store.Event
	if t.lastRev > 0 {
		// Resume after the last change seen: no List, nothing missed.
		var err error
		ch, err = hw.WatchFrom(wctx, t.prefix, t.lastRev)
		if err != nil && !errors.Is(err, store.ErrCompacted) {
			return err
		}
	}
	if ch == nil {
		// The pages' records are each at least as new as the first
		// page's revision: a watch from it replays every change since,
		// and apply skips what a later page already holds.
		rev, err := t.load(ctx, st)
		if err != nil {
			return err
		}
		t.lastRev = rev
		if ch, err = hw.WatchFrom(wctx, t.prefix, rev); err != nil {
			return err
		}
	}
	t.setSynced()
	return t.drain(ctx, ch)
}

// relist is once for a store without history: Watch first, then List, so
// nothing is missed (an event older than the record listed is ignored).
func (t *stateTable) relist(ctx, wctx context.Context, st store.Store) error {
	ch, err := st.Watch(wctx, t.prefix)
	if err != nil {
		return err
	}
	if _, err := t.load(ctx, st); err != nil {
		return err
	}
	t.setSynced()
	return t.drain(ctx, ch)
}

// load replaces the table's records with the prefix's, read loadPage
// records at a time (store.ScanPages): it holds one page of whole records
// and, for each record, its key, state and revision, never the whole
// prefix. It returns the revision the first page was read at (0 from a
// store without revisions); a watch from it misses nothing.
func (t *stateTable) load(ctx context.Context, st store.Store) (int64, error) {
	t.reset(true)
	return store.ScanPages(ctx, st, t.prefix, loadPage, func(kvs []store.KV) error {
		for _, kv := range kvs {
			t.apply(kv.Key, kv.Value, kv.Revision)
		}
		return nil
	})
}

// loadPage is how many records one store read of load takes: about 5 MB
// of machines with realistic facts.
const loadPage = 1024

func (t *stateTable) setSynced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
}

// drain applies ch's events until it closes.
func (t *stateTable) drain(ctx context.Context, ch <-chan store.Event) error {
	for ev := range ch {
		v := ev.KV.Value
		if ev.Type == store.EventDelete {
			v = nil
		} else if v == nil {
			v = []byte{}
		}
		t.apply(ev.KV.Key, v, ev.KV.Revision)
		t.lastRev = max(t.lastRev, ev.KV.Revision)
	}
	select {
	case <-ctx.Done():
		return nil
	default:
		return errWatchCut
	}
}

// errWatchCut: the store closed a watch that was not cancelled (it fell
// behind, or the store's connection was lost).
var errWatchCut = errors.New("the store closed the watch")
