package lifecycle

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// watchMachines is what corrald gives Deliver: names of changed machine
// records, from the store's watch.
func watchMachines(st store.Store) func(ctx context.Context) (<-chan string, error) {
	return func(ctx context.Context) (<-chan string, error) {
		evs, err := st.Watch(ctx, "/inventory/machines/")
		if err != nil {
			return nil, err
		}
		out := make(chan string, 64)
		go func() {
			defer close(out)
			for ev := range evs {
				select {
				case out <- strings.TrimPrefix(ev.KV.Key, "/inventory/machines/"):
				case <-ctx.Done():
					return
				}
			}
		}()
		return out, nil
	}
}

// TestPlanCrossesAppliances: two appliances on one store. The agent's
// session is on B; the operator accepts on A, which holds no session. The
// plan is a record on the machine, and B's Deliver hands it to the agent.
func TestPlanCrossesAppliances(t *testing.T) {
	st := mem.New()
	a := newHarness(t, st, harnessOpt{})
	b := newHarness(t, st, harnessOpt{})
	b.lc.cfg.WatchMachines = watchMachines(st)
	b.lc.cfg.PeerEndpoints = func(context.Context) []string { return []string{"10.0.0.2:20180", "10.0.0.1:20180", ""} }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.lc.Deliver(ctx) }()

	ag := b.connect(mac1, facts("S1", "", mac1))
	m, err := a.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: ag.name, Disk: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	// The agent is connected to B only: the plan can reach it through B
	// alone (B's Deliver may even have sent it before Accept returned).
	plan := ag.next().GetInstall()
	if plan.GetInstallId() != m.GetInstall().GetInstallId() {
		t.Fatalf("agent got %v, want the plan of install %s", plan, m.GetInstall().GetInstallId())
	}
	if got, want := strings.Join(plan.GetApplianceEndpoints(), ","), "10.0.0.1:20180,10.0.0.2:20180"; got != want {
		t.Errorf("plan endpoints %s, want %s (own first, deduplicated)", got, want)
	}
	b.eventually(ag.name, "marked sent", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetSentAt() != nil })
	// A's reconciler never sends it (no session there), and the leader part
	// of A's reconcile leaves the plan alone.
	a.reconcile()
	ag.none()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestWatchdogOnlyOnOwner: the boot watchdog of a machine runs only on the
// appliance its per-machine work is dispatched to.
func TestWatchdogOnlyOnOwner(t *testing.T) {
	st := mem.New()
	a := newHarness(t, st, harnessOpt{})
	a.lc.cfg.Owns = func(string) bool { return false }
	ag := a.connect(mac1, facts("S1", "", mac1))
	ag.close()
	name := ag.name
	armed := a.clk.Now()
	if _, err := a.inv.UpdateMachine(context.Background(), name, func(m *inventoryv1.Machine) error {
		m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: timestamppb.New(armed), ArmedBy: "test"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a.clk.Advance(DefaultBootWatchdog + 1)
	a.reconcile()
	if got := a.machine(name); got.GetState() == inventoryv1.Machine_FAILED {
		t.Fatalf("a non-owner's watchdog acted: %v %q", got.GetState(), got.GetStateReason())
	}
	a.lc.cfg.Owns = func(string) bool { return true }
	a.reconcile()
	if got := a.machine(name); got.GetState() != inventoryv1.Machine_FAILED {
		t.Fatalf("the owner's watchdog did not act: %v", got.GetState())
	}
}

// TestLeaderHandOverAppliesOnce: during a leader change two appliances may
// both run the leader's reconcile for a moment. Each transition is a
// compare-and-swap that re-checks the state it acts on, so racing
// reconcilers apply DEPLOYED and an install timeout exactly once.
func TestLeaderHandOverAppliesOnce(t *testing.T) {
	st := mem.New()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	a := newHarness(t, st, harnessOpt{clk: clk})
	b := newHarness(t, st, harnessOpt{clk: clk})
	ctx := context.Background()
	const mac2 = "52:54:00:00:00:02"
	ag1 := a.connect(mac1, facts("S1", "", mac1))
	ag2 := a.connect(mac2, facts("S2", "", mac2))
	for _, ag := range []*agent{ag1, ag2} {
		if _, err := a.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: ag.name, Disk: "auto"}); err != nil {
			t.Fatal(err)
		}
		ag.next()
	}
	clk.Advance(time.Second)
	a.applyNode(ag1.name) // machine 1's node is READY: DEPLOYED is due
	clk.Advance(DefaultInstallTimeout + time.Second)
	a.applyNode(ag1.name) // keep it READY past the clock jump
	// machine 2 made no progress: its install timeout is due.

	race := func() {
		var wg sync.WaitGroup
		for range 8 {
			for _, h := range []*harness{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := h.lc.ReconcileOnce(ctx); err != nil {
						t.Error(err)
					}
				}()
			}
		}
		wg.Wait()
	}
	race()
	race()
	if m := a.machine(ag1.name); m.GetState() != inventoryv1.Machine_DEPLOYED {
		t.Fatalf("machine 1: %v, want DEPLOYED", m.GetState())
	}
	if m := a.machine(ag2.name); m.GetState() != inventoryv1.Machine_FAILED {
		t.Fatalf("machine 2: %v, want FAILED by the install timeout", m.GetState())
	}
	for _, h := range []*harness{a, b} {
		if err := h.inv.FlushTimeline(ctx); err != nil {
			t.Fatal(err)
		}
	}
	count := func(name, kind string) int {
		es, err := a.inv.Timeline(ctx, name, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range es {
			if e.GetEvent() == kind {
				n++
			}
		}
		return n
	}
	if n := count(ag1.name, "deployed"); n != 1 {
		t.Errorf("machine 1: %d deployed entries from 32 racing reconciles, want 1", n)
	}
	if n := count(ag2.name, "install-failed"); n != 1 {
		t.Errorf("machine 2: %d install-failed entries from 32 racing reconciles, want 1", n)
	}
}

// tryConnect registers mac with h and opens a session; it returns the
// session's first answer: nil error and the agent when it was accepted.
func (h *harness) tryConnect(mac string, f *inventoryv1.Facts) (*agent, error) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	resp, err := h.client.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f})
	if err != nil {
		return nil, err
	}
	stream, err := h.client.Session(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: resp.GetSessionId()}}}); err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if first.GetWait() == nil {
		h.t.Fatalf("first message %v, want wait", first)
	}
	a := &agent{t: h.t, name: resp.GetMachineName(), stream: stream, cancel: cancel, msgs: make(chan *nodev1.ApplianceMessage, 16)}
	go func() {
		defer close(a.msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			a.msgs <- m
		}
	}()
	return a, nil
}

// TestOneSessionAcrossAppliances: the one-live-session rule holds across
// a fleet. With the agent's session on a, a second session for the machine
// on b is refused naming a; once a's stream ends, b takes the session; a
// claim that went stale (no heartbeat within the timeout) is taken over.
func TestOneSessionAcrossAppliances(t *testing.T) {
	st := mem.New()
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	a := newHarness(t, st, harnessOpt{clk: clk})
	b := newHarness(t, st, harnessOpt{clk: clk})
	a.lc.cfg.Claims = &fleet.SessionClaims{Store: st, Self: "a"}
	b.lc.cfg.Claims = &fleet.SessionClaims{Store: st, Self: "b"}

	first, err := a.tryConnect(mac1, facts("S1", "", mac1))
	if err != nil {
		t.Fatalf("first session on a: %v", err)
	}
	_, err = b.tryConnect(mac1, facts("S1", "", mac1))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "on appliance a") {
		t.Fatalf("second session on b while a's is alive: %v, want FailedPrecondition naming appliance a", err)
	}
	// a's stream ends: its claim goes with it, and b takes the session.
	first.close()
	var second *agent
	deadline := time.Now().Add(5 * time.Second)
	for {
		second, err = b.tryConnect(mac1, facts("S1", "", mac1))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("session on b after a's ended: %v", err)
	}
	// b's agent goes silent past the heartbeat timeout (its connection
	// stays up): its claim is stale and a takes over.
	clk.Advance(DefaultAgentHeartbeatTimeout + time.Second)
	if _, err := a.tryConnect(mac1, facts("S1", "", mac1)); err != nil {
		t.Fatalf("session on a after b's claim went stale: %v", err)
	}
	// b's stream learns at its next heartbeat that its claim is gone.
	clk.Advance(DefaultAgentHeartbeatTimeout/2 + time.Second)
	if err := second.stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-second.msgs:
		if ok {
			t.Fatal("b's stale stream got a message instead of ending")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b's stale stream did not end after its claim was taken over")
	}
}
