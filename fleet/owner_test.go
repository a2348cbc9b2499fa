package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

func assign(t *testing.T, st store.Store, machine, runner string) {
	t.Helper()
	ctx := context.Background()
	var rev int64
	if kv, err := st.Get(ctx, AssignmentPrefix+machine); err == nil {
		rev = kv.Revision
	}
	if _, err := record.Put(ctx, st, AssignmentPrefix+machine, &fleetv1.Assignment{Machine: machine, Runner: runner}, rev); err != nil {
		t.Fatal(err)
	}
}

func runOwner(t *testing.T, o *Owner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitFor(t, time.Second, "owner synced", o.Synced)
}

// TestOwnerFollowsAssignments: Owns and Count follow assignments written
// after the owner started, through its watch.
func TestOwnerFollowsAssignments(t *testing.T) {
	st := mem.New()
	defer st.Close()
	assign(t, st, "m0", "a") // before start: listed
	o := &Owner{Store: st, Self: "a"}
	if o.Owns("m0") {
		t.Error("owns m0 before its first list")
	}
	runOwner(t, o)
	steps := []struct {
		name  string
		write func()
		want  map[string]bool
	}{
		{"listed at start", func() {}, map[string]bool{"m0": true, "m1": false}},
		{"assigned here", func() { assign(t, st, "m1", "a") }, map[string]bool{"m0": true, "m1": true}},
		{"moved away", func() { assign(t, st, "m0", "b") }, map[string]bool{"m0": false, "m1": true}},
		{"deleted", func() {
			if err := st.Delete(context.Background(), AssignmentPrefix+"m1", mustRev(t, st, AssignmentPrefix+"m1")); err != nil {
				t.Fatal(err)
			}
		}, map[string]bool{"m0": false, "m1": false}},
		{"moved back", func() { assign(t, st, "m0", "a") }, map[string]bool{"m0": true, "m1": false}},
	}
	for _, step := range steps {
		step.write()
		waitFor(t, time.Second, step.name, func() bool {
			for m, want := range step.want {
				if o.Owns(m) != want {
					return false
				}
			}
			return true
		})
		n := 0
		for _, own := range step.want {
			if own {
				n++
			}
		}
		if got := o.Count(); got != n {
			t.Errorf("%s: Count = %d, want %d", step.name, got, n)
		}
		for m, own := range step.want {
			// Runner names the appliance: this one for what it owns,
			// another (b) or none for the rest.
			r, ok := o.Runner(m)
			if own != (ok && r == "a") || (!own && ok && r != "b") {
				t.Errorf("%s: Runner(%s) = %q, %v (owned here %v)", step.name, m, r, ok, own)
			}
		}
	}
}

func TestOwnerSoloOwnsEverything(t *testing.T) {
	st := mem.New()
	defer st.Close()
	assign(t, st, "m0", "elsewhere")
	o := &Owner{Store: st, Self: "a", Solo: true}
	for _, m := range []string{"m0", "never-assigned"} {
		if !o.Owns(m) {
			t.Errorf("solo owner does not own %s", m)
		}
	}
}

// closingStore is a real in-memory store whose watches the test can end,
// as a store ends the watch of a watcher that fell behind.
type closingStore struct {
	*mem.Store
	mu      sync.Mutex
	cancels []context.CancelFunc
}

func (s *closingStore) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancels = append(s.cancels, cancel)
	s.mu.Unlock()
	return s.Store.Watch(ctx, prefix)
}

func (s *closingStore) endWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cancels {
		c()
	}
	s.cancels = nil
}

// TestOwnerRelistsWhenWatchEnds: after its watch is closed, the owner lists
// again and so sees what changed meanwhile.
func TestOwnerRelistsWhenWatchEnds(t *testing.T) {
	st := &closingStore{Store: mem.New()}
	defer st.Close()
	o := &Owner{Store: st, Self: "a"}
	runOwner(t, o)
	// Writes land while no watch is open: only a list sees them.
	st.mu.Lock()
	for _, c := range st.cancels {
		c()
	}
	st.cancels = nil
	for _, m := range []string{"m0", "m1", "m2"} {
		assign(t, st, m, "a")
	}
	st.mu.Unlock()
	waitFor(t, 2*time.Second, "owner re-listed", func() bool { return o.Count() == 3 })
	st.endWatches()
	assign(t, st, "m3", "a")
	waitFor(t, 2*time.Second, "owner follows the new watch", func() bool { return o.Owns("m3") })
}
