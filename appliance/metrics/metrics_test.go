package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestMeteredStoreKeepsOptionalInterfaces(t *testing.T) {
	m := newStoreMetrics()
	inner := mem.New()
	st := m.wrap(inner)
	if m.wrap(st) != st {
		t.Error("wrapping a timed store again made a second layer")
	}
	if _, ok := st.(store.Updater); !ok {
		t.Error("the timed mem store is not a store.Updater")
	}
	if _, ok := st.(store.HistoryWatcher); !ok {
		t.Error("the timed mem store is not a store.HistoryWatcher")
	}
	if _, ok := st.(store.Snapshotter); !ok {
		t.Error("the timed mem store is not a store.Snapshotter")
	}
	if u, ok := st.(store.Unwrapper); !ok || u.Unwrap() != store.Store(inner) {
		t.Error("Unwrap does not return the inner store")
	}
	// A store with no optional interface stays without them, but the
	// helpers still find what it wraps.
	plain := m.wrap(struct{ store.Store }{inner})
	if _, ok := plain.(store.Updater); ok {
		t.Error("a store without Update became a store.Updater")
	}
}

func TestMeteredStoreCountsCommits(t *testing.T) {
	m := newStoreMetrics()
	st := m.wrap(mem.New())
	ctx := context.Background()
	rev, err := st.Put(ctx, "/a", []byte("1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "/a", []byte("2"), 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create: %v, want a conflict", err)
	}
	if err := st.Delete(ctx, "/nope", 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete of a missing key: %v", err)
	}
	if _, err := st.(store.Updater).Update(ctx, "/a", func(cur store.KV, exists bool) ([]byte, bool, error) {
		return []byte("3"), false, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, "/a", rev+1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Txn(ctx, []store.Op{{Kind: store.OpPut, Key: "/b", Value: []byte("1")}, {Kind: store.OpCheck, Key: "/a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Txn(ctx, []store.Op{{Kind: store.OpPut, Key: "/b", Value: []byte("2")}}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("txn creating an existing key: %v, want a conflict", err)
	}
	got := map[string]int{}
	for _, lv := range [][2]string{{"put", "ok"}, {"put", "conflict"}, {"delete", "not_found"}, {"update", "ok"}, {"delete", "ok"}, {"txn", "ok"}, {"txn", "conflict"}} {
		got[lv[0]+"/"+lv[1]] = histCount(t, m.commit, lv[0], lv[1])
	}
	want := map[string]int{"put/ok": 1, "put/conflict": 1, "delete/not_found": 1, "update/ok": 1, "delete/ok": 1, "txn/ok": 1, "txn/conflict": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("commits (-want +got):\n%s", diff)
	}
}

// histCount is how many observations a histogram vector holds for labels.
func histCount(t *testing.T, h *prometheus.HistogramVec, labels ...string) int {
	t.Helper()
	o, err := h.GetMetricWithLabelValues(labels...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(o.(prometheus.Histogram))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return int(mfs[0].GetMetric()[0].GetHistogram().GetSampleCount())
}

func putMachine(t *testing.T, st store.Store, name string, state inventoryv1.Machine_MachineState, rev int64) int64 {
	t.Helper()
	r, err := record.Put(context.Background(), st, machinesPrefix+name, &inventoryv1.Machine{Name: name, State: state}, rev)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStateCountsFollowTheStore(t *testing.T) {
	st := mem.New()
	// Records written before the counts start come from the List.
	revA := putMachine(t, st, "a", inventoryv1.Machine_DISCOVERED, 0)
	putMachine(t, st, "b", inventoryv1.Machine_DISCOVERED, 0)
	if _, err := record.Put(context.Background(), st, nodesPrefix+"n1", &poolv1.Node{Name: "n1", State: poolv1.Node_READY}, 0); err != nil {
		t.Fatal(err)
	}
	c := newStateCounts(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, st) }()
	defer func() { cancel(); <-done }()

	waitCounts(t, c, map[string]float64{"machines/DISCOVERED": 2, "nodes/READY": 1})
	// Changes after come from the Watch.
	putMachine(t, st, "a", inventoryv1.Machine_INVENTORIED, revA)
	putMachine(t, st, "c", inventoryv1.Machine_DEPLOYED, 0)
	kv, err := st.Get(context.Background(), machinesPrefix+"b")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(context.Background(), machinesPrefix+"b", kv.Revision); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, c, map[string]float64{"machines/INVENTORIED": 1, "machines/DEPLOYED": 1, "nodes/READY": 1})
}

// waitCounts waits until c's non-zero gauges are want ("kind/state").
func waitCounts(t *testing.T, c *stateCounts, want map[string]float64) {
	t.Helper()
	var got map[string]float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = map[string]float64{}
		for kind, tab := range map[string]*stateTable{"machines": c.machines, "nodes": c.nodes} {
			counts, _, synced := tab.snapshot()
			if !synced {
				continue
			}
			for s, n := range counts {
				if n != 0 {
					got[kind+"/"+s] = float64(n)
				}
			}
		}
		if cmp.Equal(want, got) {
			// The exported gauges say the same, every state present.
			if n := seriesCount(t, c, "corral_machines"); n != len(inventoryv1.Machine_MachineState_name) {
				t.Errorf("corral_machines has %d series, want one per state (%d)", n, len(inventoryv1.Machine_MachineState_name))
			}
			return
		}
	}
	t.Fatalf("counts (-want +got):\n%s", cmp.Diff(want, got))
}

// seriesCount is how many series of family c collects.
func seriesCount(t *testing.T, c prometheus.Collector, family string) int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == family {
			return len(mf.GetMetric())
		}
	}
	return 0
}

func TestPhaseTracker(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const mac = "52:54:00:00:00:01"
	type ev struct {
		at            time.Duration
		source, event string
		kind          string
	}
	boot := []ev{
		{0, "bmc", "power-on", ""},
		{30 * time.Second, "dhcp", "discover", ""},
		{32 * time.Second, "dhcp", "discover", ""}, // the firmware asks again
		{40 * time.Second, "dhcp", "discover", ""}, // iPXE's own DHCP: same boot
		{45 * time.Second, "http", "script", ""},
		{46 * time.Second, "http", "artifact", "kernel"},
		{50 * time.Second, "http", "artifact", "initrd"},
		{70 * time.Second, "inventory", "registered", ""},
	}
	install := []ev{
		{100 * time.Second, "lifecycle", "plan-sent", ""},
		{160 * time.Second, "lifecycle", "installed", ""},
		{170 * time.Second, "dhcp", "discover", ""},
		{175 * time.Second, "http", "script", ""},
		{176 * time.Second, "http", "artifact", "kernel"},
		{180 * time.Second, "http", "artifact", "initrd"},
		{200 * time.Second, "lifecycle", "deployed", ""},
	}
	tests := map[string]struct {
		events []ev
		want   map[string]float64 // phase → sum of seconds
	}{
		"discovery boot": {boot, map[string]float64{
			phasePowerToDHCP: 30, phaseDHCPToScript: 15, phaseScriptToImage: 5, phaseImageToAgent: 20}},
		"install and hypervisor boot": {append(append([]ev{}, boot...), install...), map[string]float64{
			phasePowerToDHCP: 30, phaseDHCPToScript: 15 + 5, phaseScriptToImage: 5 + 5, phaseImageToAgent: 20 + 20,
			phaseInstall: 60, phaseToReady: 40}},
		"install and hypervisor boot by kexec": {append(append([]ev{}, boot...),
			ev{100 * time.Second, "lifecycle", "plan-sent", ""}, ev{160 * time.Second, "lifecycle", "installed", ""},
			ev{161 * time.Second, "lifecycle", "kexec", ""},
			ev{162 * time.Second, "http", "artifact", "kernel"}, ev{164 * time.Second, "http", "artifact", "initrd"},
			ev{200 * time.Second, "lifecycle", "deployed", ""}), map[string]float64{
			phasePowerToDHCP: 30, phaseDHCPToScript: 15, phaseScriptToImage: 5 + 3, phaseImageToAgent: 20 + 36,
			phaseInstall: 60, phaseToReady: 40}},
		"script without a DISCOVER seen": {[]ev{{0, "http", "script", ""}, {1, "http", "artifact", "kernel"}}, map[string]float64{}},
		// The timeline's writers run in parallel: a boot's DISCOVER entry
		// can be stored after its script's.
		"DISCOVER stored after its script": {[]ev{{0, "bmc", "power-on", ""}, {31 * time.Second, "http", "script", ""},
			{30 * time.Second, "dhcp", "discover", ""}, {32 * time.Second, "http", "artifact", "kernel"}, {33 * time.Second, "http", "artifact", "initrd"}},
			map[string]float64{phasePowerToDHCP: 30, phaseDHCPToScript: 1, phaseScriptToImage: 2}},
		"a later DISCOVER is the next boot's": {[]ev{{0, "http", "script", ""}, {60 * time.Second, "dhcp", "discover", ""},
			{65 * time.Second, "http", "script", ""}}, map[string]float64{phaseDHCPToScript: 5}},
		"initrd alone is not the images": {[]ev{{0, "dhcp", "discover", ""}, {time.Second, "http", "script", ""},
			{2 * time.Second, "http", "artifact", "initrd"}, {3 * time.Second, "http", "artifact", "initrd"}},
			map[string]float64{phaseDHCPToScript: 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newPhaseTracker(slog.New(slog.DiscardHandler))
			for _, e := range tc.events {
				attrs := map[string]string{}
				if e.kind != "" {
					attrs["kind"] = e.kind
				}
				p.entry(&inventoryv1.TimelineEntry{Mac: mac, Source: e.source, Event: e.event, Attributes: attrs, At: timestamppb.New(t0.Add(e.at))})
			}
			got := phaseSums(t, p.hist)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("phase sums (-want +got):\n%s", diff)
			}
		})
	}
}

func phaseSums(t *testing.T, h *prometheus.HistogramVec) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleSum()
		}
	}
	return got
}

func TestPhaseTrackerForgetsOldestMAC(t *testing.T) {
	p := newPhaseTracker(slog.New(slog.DiscardHandler))
	at := timestamppb.New(time.Unix(1000, 0))
	for i := range maxPhaseMACs + 10 {
		mac := fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i))
		p.entry(&inventoryv1.TimelineEntry{Mac: mac, Source: "dhcp", Event: "discover", At: at})
	}
	if n := len(p.macs); n != maxPhaseMACs {
		t.Errorf("%d MACs kept, want the cap %d", n, maxPhaseMACs)
	}
}

func TestReadinessNamesWhatIsMissing(t *testing.T) {
	st := mem.New()
	r := &readiness{store: st}
	flag := r.track("boot-http")
	if got := r.check(context.Background()); got != "boot servers not serving: boot-http" {
		t.Errorf("before the boot server runs: %q", got)
	}
	flag.Store(true)
	if got := r.check(context.Background()); got != "" {
		t.Errorf("all up: %q", got)
	}
	st.Close()
	r.at = time.Time{} // no reuse of the last check
	if got := r.check(context.Background()); !strings.HasPrefix(got, "store does not answer within 1s") {
		t.Errorf("store closed: %q", got)
	}
}

// cuttingStore is a mem store whose watches the test can cut (as a store
// cuts a watcher that falls behind); it counts Lists (and paged reads).
type cuttingStore struct {
	*mem.Store
	mu    sync.Mutex
	cut   chan struct{} // closed to cut the watches started before
	lists atomic.Int32
}

// cutAll ends every watch running now; later ones run on.
func (c *cuttingStore) cutAll() {
	c.mu.Lock()
	close(c.cut)
	c.cut = make(chan struct{})
	c.mu.Unlock()
}

func (c *cuttingStore) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	c.lists.Add(1)
	return c.Store.ListRevision(ctx, prefix)
}

// ListPage counts a read of a prefix's first page as a List.
func (c *cuttingStore) ListPage(ctx context.Context, prefix, startAfter string, limit int) ([]store.KV, int64, error) {
	if startAfter == "" {
		c.lists.Add(1)
	}
	return c.Store.ListPage(ctx, prefix, startAfter, limit)
}

func (c *cuttingStore) WatchFrom(ctx context.Context, prefix string, after int64) (<-chan store.Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	in, err := c.Store.WatchFrom(ctx, prefix, after)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan store.Event)
	c.mu.Lock()
	cut := c.cut
	c.mu.Unlock()
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				out <- ev
			case <-cut:
				return
			}
		}
	}()
	return out, nil
}

func TestStateCountsResumeACutWatch(t *testing.T) {
	st := &cuttingStore{Store: mem.NewWithHistory(1024, 1<<20), cut: make(chan struct{})}
	rev := putMachine(t, st, "a", inventoryv1.Machine_DISCOVERED, 0)
	c := newStateCounts(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, st) }()
	defer func() { cancel(); <-done }()
	waitCounts(t, c, map[string]float64{"machines/DISCOVERED": 1})

	st.cutAll()
	putMachine(t, st, "a", inventoryv1.Machine_INVENTORIED, rev)
	waitCounts(t, c, map[string]float64{"machines/INVENTORIED": 1})
	if n := st.lists.Load(); n != 2 { // one per prefix, at start
		t.Errorf("%d Lists, want 2: a cut watch resumes from its revision without listing again", n)
	}
}

// TestWrapStoreExportsCommits: a store timed by WrapStore (New's early
// wrap in the appliance) is timed by the histogram the registry exports,
// and is not wrapped a second time.
func TestWrapStoreExportsCommits(t *testing.T) {
	m := New(Config{}, slog.New(slog.DiscardHandler))
	st := m.WrapStore(mem.New())
	if m.WrapStore(st) != st {
		t.Error("WrapStore wrapped the timed store again")
	}
	if _, err := st.Put(context.Background(), "/k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if n := histCount(t, m.store.commit, "put", "ok"); n != 1 {
		t.Errorf("%d puts timed, want 1", n)
	}
	if n := seriesCount(t, m.reg, "corral_store_commit_seconds"); n != 1 {
		t.Errorf("the registry exports %d store commit series, want 1", n)
	}
}
