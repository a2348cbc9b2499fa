package webhook

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// collapse drops consecutive repeats: after a resume the first change of
// a machine is sent whatever its previous state.
func collapse(in []string) []string { return slices.Compact(slices.Clone(in)) }

func runDispatcher(t *testing.T, st store.Store, svc *Service) (*Dispatcher, func()) {
	t.Helper()
	d, err := NewDispatcher(Config{Store: st, Service: svc, Registerer: prometheus.NewRegistry(), InitialInterval: 10 * time.Millisecond,
		MaxInterval: 50 * time.Millisecond, Timeout: 2 * time.Second, CursorInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	return d, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestCursor: the stored cursor only moves forward; a second dispatcher
// (a new leader) resumes a receiver from it, so the changes committed while
// none ran and the events the first one still held arrive, in order, under
// their IDs; a cursor the history no longer reaches is counted and marked
// on the receiver, and delivery continues.
func TestCursor(t *testing.T) {
	ctx := context.Background()
	st := mem.NewWithHistory(10000, 0)
	if got, err := AdvanceCursor(ctx, st, "x", 10); err != nil || got != 10 {
		t.Fatalf("advance to 10: %d %v", got, err)
	}
	if got, err := AdvanceCursor(ctx, st, "x", 7); err != nil || got != 10 {
		t.Fatalf("advance back to 7: %d %v (want it kept at 10)", got, err)
	}
	if c, ok, err := ReadCursor(ctx, st, "x"); err != nil || !ok || c.Revision != 10 {
		t.Fatalf("read: %v %v %v", c, ok, err)
	}

	svc := NewService(st, plainSealer{}, Guard{}, nil)
	rcv := newReceiver(t)
	d1, stop1 := runDispatcher(t, st, svc)
	_, secret, err := svc.Add(ctx, &webhookv1.AddWebhookRequest{Name: "r", Url: rcv.srv.URL, Events: []string{"machine.state"}, AllowBootLan: true, CaPem: caPEM(rcv.srv)})
	if err != nil {
		t.Fatal(err)
	}
	rcv.secret = secret
	waitFor(t, "receiver served", 5*time.Second, func() bool { d1.mu.Lock(); defer d1.mu.Unlock(); return len(d1.targets) == 1 })

	cycle := []inventoryv1.Machine_MachineState{inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_READY, inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYING, inventoryv1.Machine_DEPLOYED}
	var want []string
	change := func(n int) {
		for range n {
			s := cycle[len(want)%len(cycle)]
			setState(t, st, "m1", s)
			want = append(want, s.String())
		}
	}
	change(10)
	waitFor(t, "the first changes", 10*time.Second, func() bool { return len(rcv.states("m1")) == 10 })
	waitFor(t, "the cursor stored", 5*time.Second, func() bool {
		c, ok, _ := ReadCursor(ctx, st, "r")
		kv, err := st.Get(ctx, store.MachinesPrefix+"m1")
		return ok && err == nil && c.Revision >= kv.Revision
	})
	time.Sleep(50 * time.Millisecond) // the last flush
	// Idle, the cursors are not rewritten (their own writes do not move
	// them).
	idle, _ := st.Revision(ctx)
	time.Sleep(100 * time.Millisecond) // five flush intervals
	if rev, _ := st.Revision(ctx); rev != idle {
		t.Fatalf("store revision moved from %d to %d with nothing to send", idle, rev)
	}
	// The receiver goes down: the first leader queues and retries, then
	// stops with the events still queued.
	rcv.mu.Lock()
	rcv.down = true
	rcv.mu.Unlock()
	change(10)
	waitFor(t, "refusals", 5*time.Second, func() bool { rcv.mu.Lock(); defer rcv.mu.Unlock(); return rcv.refused >= 2 })
	stop1()
	change(10) // while no leader runs
	rcv.mu.Lock()
	rcv.down = false
	rcv.mu.Unlock()
	d2, stop2 := runDispatcher(t, st, svc)
	change(10)
	waitFor(t, "every change after the takeover", 10*time.Second, func() bool { return len(collapse(rcv.states("m1"))) >= len(want) })
	if got := collapse(rcv.states("m1")); !slices.Equal(got, want) {
		t.Fatalf("states %v\nwant %v", got, want)
	}
	if rcv.bad != 0 {
		t.Fatalf("%d requests failed verification", rcv.bad)
	}
	if v := value(d2.metrics.lost.WithLabelValues("r")); v > 0 {
		t.Fatalf("history lost counted %v times with the history intact", v)
	}
	stop2()

	// A cursor the history does not reach: counted, marked, continued.
	small := mem.NewWithHistory(4, 0)
	svc = NewService(small, plainSealer{}, Guard{}, nil)
	rcv2 := newReceiver(t)
	_, secret, err = svc.Add(ctx, &webhookv1.AddWebhookRequest{Name: "r", Url: rcv2.srv.URL, Events: []string{"machine.state"}, AllowBootLan: true, CaPem: caPEM(rcv2.srv)})
	if err != nil {
		t.Fatal(err)
	}
	rcv2.secret = secret
	if _, err := AdvanceCursor(ctx, small, "r", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		setState(t, small, "m2", cycle[i%len(cycle)])
	}
	d3, stop3 := runDispatcher(t, small, svc)
	defer stop3()
	waitFor(t, "the loss counted", 5*time.Second, func() bool { return value(d3.metrics.lost.WithLabelValues("r")) == 1 })
	waitFor(t, "the loss marked", 5*time.Second, func() bool {
		rs, _, err := svc.List(ctx, 0, "")
		return err == nil && len(rs) == 1 && rs[0].GetCutAt() == nil && strings.HasPrefix(rs[0].GetCutReason(), HistoryLostMark)
	})
	setState(t, small, "m2", inventoryv1.Machine_FAILED)
	waitFor(t, "delivery continued", 5*time.Second, func() bool {
		s := rcv2.states("m2")
		return len(s) > 0 && s[len(s)-1] == "FAILED"
	})
}
