package inventory

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/watchstream"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// watchEnv is an inventory on a real bbolt store (a history ring of 512
// events) served over gRPC.
type watchEnv struct {
	inv  *Inventory
	st   *bolt.Store
	lim  *watchstream.Limiter
	cli  inventoryv1.MachineServiceClient
	mu   sync.Mutex
	revs map[string]int64
}

func newWatchEnv(t *testing.T) *watchEnv {
	t.Helper()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{HistoryEvents: 512})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { inv.Run(ctx); close(done) }()
	e := &watchEnv{inv: inv, st: st, lim: watchstream.NewLimiter(10), revs: map[string]int64{}}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Register(srv, &MachineServer{Inv: inv, Watchers: e.lim})
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		cancel()
		<-done
		st.Close()
	})
	e.cli = inventoryv1.NewMachineServiceClient(conn)
	return e
}

// put writes a machine record in the given state and returns its revision.
func (e *watchEnv) put(t *testing.T, name string, state inventoryv1.Machine_MachineState) int64 {
	t.Helper()
	e.mu.Lock()
	prev := e.revs[machinePrefix+name]
	e.mu.Unlock()
	rev, err := record.Put(t.Context(), e.st, machinePrefix+name, &inventoryv1.Machine{Name: name, State: state, Serial: "S-" + name}, prev)
	if err != nil {
		t.Error(err)
		return 0
	}
	e.mu.Lock()
	e.revs[machinePrefix+name] = rev
	e.mu.Unlock()
	return rev
}

func (e *watchEnv) del(t *testing.T, name string) {
	t.Helper()
	if err := e.st.Delete(t.Context(), machinePrefix+name, e.revs[machinePrefix+name]); err != nil {
		t.Fatal(err)
	}
}

// recv reads n events as "TYPE name state" lines.
func recv[E interface{ GetRevision() int64 }](t *testing.T, n int, next func() (E, error), line func(E) string) ([]string, []E) {
	t.Helper()
	var lines []string
	var evs []E
	for range n {
		ev, err := next()
		if err != nil {
			t.Fatalf("after %v: %v", lines, err)
		}
		lines = append(lines, line(ev))
		evs = append(evs, ev)
	}
	return lines, evs
}

func machineLine(ev *inventoryv1.MachineEvent) string {
	if ev.GetMachine() == nil {
		return ev.GetType().String()
	}
	return fmt.Sprintf("%s %s %s", ev.GetType(), ev.GetMachine().GetName(), ev.GetMachine().GetState())
}

func TestWatchMachines(t *testing.T) {
	e := newWatchEnv(t)
	e.put(t, "m1", inventoryv1.Machine_INVENTORIED)
	e.put(t, "m2", inventoryv1.Machine_DISCOVERED)
	e.put(t, "m10", inventoryv1.Machine_INVENTORIED)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	all, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{State: inventoryv1.Machine_INVENTORIED})
	if err != nil {
		t.Fatal(err)
	}
	one, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{Name: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	got, evs := recv(t, 4, all.Recv, machineLine)
	want := []string{"ADDED m1 INVENTORIED", "ADDED m10 INVENTORIED", "ADDED m2 DISCOVERED", "SYNCED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("initial (-want +got):\n%s", diff)
	}
	synced := evs[3].GetRevision()
	// The machines are the records Get returns.
	m1, err := e.cli.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: "m1"})
	if err != nil || m1.GetSerial() != "S-m1" || evs[0].GetMachine().GetSerial() != "S-m1" {
		t.Fatalf("GetMachine = %v, %v; event %v", m1, err, evs[0].GetMachine())
	}
	if got, _ := recv(t, 3, inv.Recv, machineLine); !cmp.Equal(got, []string{"ADDED m1 INVENTORIED", "ADDED m10 INVENTORIED", "SYNCED"}) {
		t.Fatalf("state-filtered initial: %v", got)
	}
	if got, _ := recv(t, 2, one.Recv, machineLine); !cmp.Equal(got, []string{"ADDED m1 INVENTORIED", "SYNCED"}) {
		t.Fatalf("one-machine initial: %v", got)
	}

	e.put(t, "m1", inventoryv1.Machine_INSTALLING)  // leaves the state filter
	e.put(t, "m2", inventoryv1.Machine_INVENTORIED) // enters it
	e.put(t, "m3", inventoryv1.Machine_DISCOVERED)
	e.del(t, "m10")
	got, _ = recv(t, 4, all.Recv, machineLine)
	want = []string{"MODIFIED m1 INSTALLING", "MODIFIED m2 INVENTORIED", "ADDED m3 DISCOVERED", "DELETED m10 UNSPECIFIED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("live (-want +got):\n%s", diff)
	}
	got, _ = recv(t, 3, inv.Recv, machineLine)
	want = []string{"DELETED m1 INSTALLING", "ADDED m2 INVENTORIED", "DELETED m10 UNSPECIFIED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("filtered live (-want +got):\n%s", diff)
	}
	if got, _ := recv(t, 1, one.Recv, machineLine); !cmp.Equal(got, []string{"MODIFIED m1 INSTALLING"}) {
		t.Fatalf("one-machine live: %v", got)
	}

	// Resume from SYNCED: exactly the changes after it, no list.
	res, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{FromRevision: synced})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = recv(t, 4, res.Recv, machineLine)
	want = []string{"MODIFIED m1 INSTALLING", "MODIFIED m2 INVENTORIED", "MODIFIED m3 DISCOVERED", "DELETED m10 UNSPECIFIED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("resumed (-want +got):\n%s", diff)
	}

	// Cancelling the streams releases their watchers.
	cancel()
	waitFor(t, "watchers released", func() bool { return e.lim.Active() == 0 })
}

func TestWatchMachinesErrors(t *testing.T) {
	e := newWatchEnv(t)
	first := e.put(t, "m1", inventoryv1.Machine_INVENTORIED)
	for i := range 600 { // more than the ring of 512
		e.put(t, "m1", inventoryv1.Machine_MachineState(1+i%2))
	}
	cases := map[string]struct {
		req  *inventoryv1.WatchMachinesRequest
		code codes.Code
		text string
	}{
		"compacted": {&inventoryv1.WatchMachinesRequest{FromRevision: first}, codes.OutOfRange, "re-list with from_revision 0"},
		"future":    {&inventoryv1.WatchMachinesRequest{FromRevision: 1 << 40}, codes.OutOfRange, "re-list with from_revision 0"},
		"negative":  {&inventoryv1.WatchMachinesRequest{FromRevision: -1}, codes.InvalidArgument, "negative"},
		"bad name":  {&inventoryv1.WatchMachinesRequest{Name: "a/b"}, codes.InvalidArgument, "malformed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := e.cli.WatchMachines(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := s.Recv()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.text) {
				t.Fatalf("Recv = %v, %v; want %v saying %q", ev, err, tc.code, tc.text)
			}
		})
	}
	// Too many watchers.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 10 {
		s, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("11th watcher: %v, want ResourceExhausted", err)
	}
}

// TestWatchMachinesSlowClient: a client that stops reading is cut with
// RESOURCE_EXHAUSTED naming the revision to resume from, while 5,000
// writes go on at full speed.
func TestWatchMachinesSlowClient(t *testing.T) {
	e := newWatchEnv(t)
	e.put(t, "m0", inventoryv1.Machine_INVENTORIED)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	slow, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := recv(t, 2, slow.Recv, machineLine); got[1] != "SYNCED" {
		t.Fatalf("initial %v", got)
	}
	// A watcher that keeps reading sees every write.
	fast, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, 2, fast.Recv, machineLine)
	const writers, each = 16, 5000 / 16
	fastDone := make(chan int)
	go func() {
		n := 0
		for n < writers*each {
			if _, err := fast.Recv(); err != nil {
				break
			}
			n++
		}
		fastDone <- n
	}()
	begin := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				e.put(t, fmt.Sprintf("w%02d-%03d", w, i), inventoryv1.Machine_DISCOVERED)
			}
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	t.Logf("%d writes with a stalled watcher: %v", writers*each, took)
	if took > 2*time.Minute {
		t.Fatalf("writes took %v: writers waited for the stalled watcher", took)
	}
	select {
	case n := <-fastDone:
		if n != writers*each {
			t.Fatalf("the reading watcher got %d of %d events", n, writers*each)
		}
	case <-time.After(time.Minute):
		t.Fatal("the reading watcher did not get every event")
	}
	// The stalled client now reads: what was sent, then the cut.
	var last int64
	for {
		ev, err := slow.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), fmt.Sprintf("resume with from_revision %d", last)) {
				t.Fatalf("stalled watcher ended with %v, want ResourceExhausted naming revision %d", err, last)
			}
			break
		}
		last = ev.GetRevision()
	}
	cancel()
	waitFor(t, "watchers released", func() bool { return e.lim.Active() == 0 })
}

func TestWatchTimeline(t *testing.T) {
	e := newWatchEnv(t)
	macs := []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}
	if _, err := record.Put(t.Context(), e.st, machinePrefix+"m1", &inventoryv1.Machine{Name: "m1", Macs: macs, BootMac: macs[0]}, 0); err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1_700_000_000, 0)
	for i := range 6 {
		e.inv.Record(&inventoryv1.TimelineEntry{Mac: macs[i%2], At: timestamppb.New(base.Add(time.Duration(i) * time.Second)), Source: "dhcp", Event: fmt.Sprintf("e%d", i)})
	}
	e.inv.Event("52:54:00:00:00:99", "dhcp", "other-machine", "", nil)
	if err := e.inv.FlushTimeline(t.Context()); err != nil {
		t.Fatal(err)
	}
	line := func(ev *inventoryv1.TimelineEvent) string {
		return strings.TrimSpace(ev.GetType().String() + " " + ev.GetEntry().GetEvent())
	}
	s, err := e.cli.WatchTimeline(t.Context(), &inventoryv1.WatchTimelineRequest{Name: "m1", Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	got, evs := recv(t, 5, s.Recv, line)
	want := []string{"ADDED e2", "ADDED e3", "ADDED e4", "ADDED e5", "SYNCED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("initial (-want +got):\n%s", diff)
	}
	synced := evs[4].GetRevision()
	e.inv.Event(macs[1], "http", "script", "", nil)
	e.inv.Event("52:54:00:00:00:99", "dhcp", "other-machine", "", nil)
	e.inv.Event(macs[0], "agent", "registered", "", nil)
	got, _ = recv(t, 2, s.Recv, line)
	slices.Sort(got) // the timeline's writers store entries concurrently
	if !cmp.Equal(got, []string{"ADDED registered", "ADDED script"}) {
		t.Fatalf("live: %v", got)
	}
	// One MAC, resumed from SYNCED.
	r, err := e.cli.WatchTimeline(t.Context(), &inventoryv1.WatchTimelineRequest{Mac: "52-54-00-00-00-01", FromRevision: synced})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := recv(t, 1, r.Recv, line); !cmp.Equal(got, []string{"ADDED registered"}) {
		t.Fatalf("resumed one MAC: %v", got)
	}
	bad, _ := e.cli.WatchTimeline(t.Context(), &inventoryv1.WatchTimelineRequest{})
	if _, err := bad.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no name or MAC: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchMachinesSummary: the SUMMARY view cuts every machine the watch
// sends, in the first list and after, while the filters still see the
// state; the default view sends whole records.
func TestWatchMachinesSummary(t *testing.T) {
	e := newWatchEnv(t)
	full := func(name string, state inventoryv1.Machine_MachineState) {
		t.Helper()
		m := &inventoryv1.Machine{Name: name, State: state, Serial: "S-" + name,
			Facts:       &inventoryv1.Facts{Nics: []*inventoryv1.Facts_Nic{{Name: "eth0", Driver: "virtio_net", PciAddress: "0000:00:03.0"}}, Disks: []*inventoryv1.Facts_Disk{{Name: "sda", SizeBytes: 1 << 30}}},
			FactHistory: []*inventoryv1.FactChange{{}}}
		e.mu.Lock()
		prev := e.revs[machinePrefix+name]
		e.mu.Unlock()
		rev, err := record.Put(t.Context(), e.st, machinePrefix+name, m, prev)
		if err != nil {
			t.Fatal(err)
		}
		e.mu.Lock()
		e.revs[machinePrefix+name] = rev
		e.mu.Unlock()
	}
	full("m1", inventoryv1.Machine_INVENTORIED)
	full("m2", inventoryv1.Machine_DISCOVERED)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sum, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{State: inventoryv1.Machine_INVENTORIED, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := e.cli.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, m *inventoryv1.Machine, summary bool) {
		t.Helper()
		if got := m.GetFacts().GetNics()[0].GetDriver() == "" && len(m.GetFactHistory()) == 0; got != summary {
			t.Errorf("%s %s: NICs %v, history %d entries; summary %v", what, m.GetName(), m.GetFacts().GetNics(), len(m.GetFactHistory()), summary)
		}
		if len(m.GetFacts().GetDisks()) != 1 || m.GetFacts().GetNics()[0].GetName() != "eth0" || m.GetSerial() == "" {
			t.Errorf("%s %s: disks %v NICs %v serial %q: a summary keeps them", what, m.GetName(), m.GetFacts().GetDisks(), m.GetFacts().GetNics(), m.GetSerial())
		}
	}
	got, evs := recv(t, 2, sum.Recv, machineLine)
	if !cmp.Equal(got, []string{"ADDED m1 INVENTORIED", "SYNCED"}) {
		t.Fatalf("summary initial: %v", got)
	}
	check("first list", evs[0].GetMachine(), true)
	_, evs = recv(t, 3, whole.Recv, machineLine)
	check("first list, full view", evs[0].GetMachine(), false)

	full("m2", inventoryv1.Machine_INVENTORIED) // enters the filter
	got, evs = recv(t, 1, sum.Recv, machineLine)
	if !cmp.Equal(got, []string{"ADDED m2 INVENTORIED"}) {
		t.Fatalf("summary live: %v", got)
	}
	check("live", evs[0].GetMachine(), true)
}
