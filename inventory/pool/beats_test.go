package pool

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/google/go-cmp/cmp"
)

// nodeWrites counts writes of node records.
type nodeWrites struct {
	store.Store
	n atomic.Int64
}

func (w *nodeWrites) Put(ctx context.Context, key string, v []byte, rev int64) (int64, error) {
	if strings.HasPrefix(key, nodePrefix) {
		w.n.Add(1)
	}
	return w.Store.Put(ctx, key, v, rev)
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestHeartbeatsUnwritten: with HeartbeatWriteAfter, beats that change
// nothing are not written, yet the sweep judges silence exactly as before
// (on the appliance that receives them), on another appliance of a fleet
// within the timeout, and after a restart not before the timeout; a
// change of spec or a NOT_READY node is written at once.
func TestHeartbeatsUnwritten(t *testing.T) {
	ctx := context.Background()
	spec := func(name string) *poolv1.ApplyNodeRequest {
		return &poolv1.ApplyNodeRequest{Name: name, CpuMilliCores: 1000, MemoryBytes: 1 << 30, Labels: map[string]string{"rack": "r1"}}
	}
	tests := map[string]struct {
		after      time.Duration // HeartbeatWriteAfter
		fleet      bool          // the sweep runs in another Pool on the same store (no shared memory)
		restartAt  time.Duration // the Pool is replaced by a new one (a restart: memory lost)
		beatsUntil time.Duration
		wantWrites int64 // node records written, the NOT_READY included
		// wantNotReadyAt is the first sweep (every 15 s) that finds the
		// node NOT_READY (timeout 30 s).
		wantNotReadyAt time.Duration
	}{
		"one appliance: only the first beat written": {after: 5 * time.Minute, beatsUntil: 200 * time.Second, wantWrites: 2, wantNotReadyAt: 240 * time.Second},
		"every beat written (off)":                   {after: 0, beatsUntil: 200 * time.Second, wantWrites: 22, wantNotReadyAt: 240 * time.Second},
		"fleet: the leader sees beats another appliance received": {after: 15 * time.Second, fleet: true,
			beatsUntil: 200 * time.Second, wantWrites: 12, wantNotReadyAt: 240 * time.Second},
		"restart: beats unwritten before it do not flap": {after: 5 * time.Minute, restartAt: 50 * time.Second,
			beatsUntil: 100 * time.Second, wantWrites: 2, wantNotReadyAt: 135 * time.Second},
		"restart: a node silent since before is NOT_READY a timeout after it": {after: 5 * time.Minute, restartAt: 50 * time.Second,
			beatsUntil: 40 * time.Second, wantWrites: 2, wantNotReadyAt: 90 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			clk := &fakeClock{now: time.Unix(1_800_000_000, 0)}
			st := &nodeWrites{Store: mem.New()}
			mk := func() *Pool {
				p, err := New(Config{Store: st, Now: clk.Now, HeartbeatWriteAfter: tc.after})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			beater := mk()
			sweeper := beater
			if tc.fleet {
				sweeper = mk()
			}
			start := clk.Now()
			var notReadyAt time.Duration
			for at := time.Duration(0); at <= 300*time.Second && notReadyAt == 0; at += 5 * time.Second {
				clk.now = start.Add(at)
				if tc.restartAt > 0 && at == tc.restartAt {
					beater = mk()
					sweeper = beater
				}
				if at <= tc.beatsUntil && at%(10*time.Second) == 0 {
					if _, err := beater.ApplyNode(ctx, spec("n1")); err != nil {
						t.Fatal(err)
					}
				}
				if at > 0 && at%(15*time.Second) == 0 {
					if err := (&Sweeper{Pool: sweeper}).SweepOnce(ctx); err != nil {
						t.Fatal(err)
					}
					n, err := sweeper.GetNode(ctx, "n1")
					if err != nil {
						t.Fatal(err)
					}
					if n.GetState() == poolv1.Node_NOT_READY {
						notReadyAt = at
					}
				}
			}
			if got := st.n.Load(); got != tc.wantWrites {
				t.Errorf("%d node writes, want %d", got, tc.wantWrites)
			}
			if notReadyAt != tc.wantNotReadyAt {
				t.Errorf("NOT_READY at the sweep of %v, want %v (beats until %v)", notReadyAt, tc.wantNotReadyAt, tc.beatsUntil)
			}
			// A beat of a NOT_READY node is written: READY again.
			before := st.n.Load()
			n, err := beater.ApplyNode(ctx, spec("n1"))
			if err != nil || n.GetState() != poolv1.Node_READY || st.n.Load() != before+1 {
				t.Errorf("beat after NOT_READY: %v %v, %d writes", n.GetState(), err, st.n.Load()-before)
			}
		})
	}

	t.Run("a change of spec is written at once, reads see the newest beat", func(t *testing.T) {
		clk := &fakeClock{now: time.Unix(1_800_000_000, 0)}
		st := &nodeWrites{Store: mem.New()}
		p, err := New(Config{Store: st, Now: clk.Now, HeartbeatWriteAfter: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.ApplyNode(ctx, spec("n1")); err != nil {
			t.Fatal(err)
		}
		clk.advance(10 * time.Second)
		beat, err := p.ApplyNode(ctx, spec("n1"))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := p.GetNode(ctx, "n1")
		list, _ := p.ListNodes(ctx)
		for what, n := range map[string]*poolv1.Node{"ApplyNode": beat, "GetNode": got, "ListNodes": list[0]} {
			if d := cmp.Diff(clk.Now().Unix(), n.GetLastHeartbeat().AsTime().Unix()); d != "" {
				t.Errorf("%s: last_heartbeat (-want +got):\n%s", what, d)
			}
		}
		if st.n.Load() != 1 {
			t.Fatalf("%d writes after a beat, want 1", st.n.Load())
		}
		r := spec("n1")
		r.Labels["rack"] = "r2"
		if _, err := p.ApplyNode(ctx, r); err != nil {
			t.Fatal(err)
		}
		stored, _ := New(Config{Store: st, Now: clk.Now})
		n, _ := stored.GetNode(ctx, "n1")
		if st.n.Load() != 2 || n.GetLabels()["rack"] != "r2" {
			t.Errorf("spec change: %d writes, stored labels %v", st.n.Load(), n.GetLabels())
		}
	})
}
