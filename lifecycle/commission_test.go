package lifecycle

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/bolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func sendTest(t *testing.T, a *agent, id string, ct *inventoryv1.CommissionTest, done bool, errText string) {
	t.Helper()
	if err := a.stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: &nodev1.Progress{
		InstallId: id, Step: "test", CommissionTest: ct, Done: done, Error: errText}}}); err != nil {
		t.Fatal(err)
	}
}

// TestCommission: commissioning a connected machine sends the profile's
// plan; results land on the record, bounded; a run with a failed test
// fails the machine's commissioning, which holds it back from accept (to
// the pool and as a node) and from allocation until an operator clears
// it; a run whose tests all pass passes, whatever the agent claims.
func TestCommission(t *testing.T) {
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := newHarness(t, st, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	csrv := &inventory.CommissionServer{Inv: h.inv, Lifecycle: h.lc}

	if _, err := csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name, Profile: "nope"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown profile: %v", err)
	}
	m, err := csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name, Profile: "link-10g"})
	if err != nil {
		t.Fatal(err)
	}
	c := m.GetCommission()
	plan := a.next().GetCommission()
	if plan.GetCommissionId() != c.GetCommissionId() || plan.GetProfile() != "link-10g" || len(plan.GetSteps()) != 5 || plan.GetSteps()[4].GetMinLinkMbps() != 10000 {
		t.Fatalf("plan %v for %v", plan, c)
	}
	h.eventually(a.name, "running", func(m *inventoryv1.Machine) bool { return m.GetCommission().GetStatus() == inventory.CommissionRunning })
	if _, err := csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second while running: %v", err)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("accept while commissioning: %v", err)
	}
	id := c.GetCommissionId()
	big := strings.Repeat("x", 10<<10) + "\x1b[2J"
	sendTest(t, a, id, &inventoryv1.CommissionTest{Name: "smart", Target: "/dev/vda", Result: "skip", Summary: "no SMART"}, false, "")
	sendTest(t, a, id, &inventoryv1.CommissionTest{Name: "link", Target: "eth0", Result: "fail", Summary: "link up, speed unknown: below 10000 Mb/s", Output: big}, false, "")
	sendTest(t, a, id, &inventoryv1.CommissionTest{Name: "rm-rf", Result: "pass"}, false, "")
	sendTest(t, a, "commission-0000000000000000", &inventoryv1.CommissionTest{Name: "smart", Result: "pass"}, true, "") // another's: dropped
	sendTest(t, a, id, nil, true, "1 of 2 tests failed: link eth0")
	m = h.eventually(a.name, "failed", func(m *inventoryv1.Machine) bool { return m.GetCommission().GetStatus() == inventory.CommissionFailed })
	c = m.GetCommission()
	if len(c.GetTests()) != 3 || len(c.GetTests()[1].GetOutput()) != inventory.MaxCommissionOutput || c.GetTests()[2].GetResult() != "fail" ||
		c.GetError() != "2 of 3 tests failed: link eth0, rm-rf" || c.GetFinishedAt() == nil {
		t.Fatalf("failed commissioning %v", c)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "failed commissioning") {
		t.Fatalf("accept to the pool after a failure: %v", err)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_HYPERVISOR}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("accept as a node after a failure: %v", err)
	}
	if _, err := csrv.ClearCommission(ctx, &inventoryv1.ClearCommissionRequest{Name: a.name}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); err != nil {
		t.Fatalf("accept after clearing: %v", err)
	}

	// READY and commissioned again: held back from allocation while it
	// runs and after it fails; a pass frees it.
	m, err = csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name})
	if err != nil {
		t.Fatal(err)
	}
	id = m.GetCommission().GetCommissionId()
	if p := a.next().GetCommission(); p.GetProfile() != "quick" || p.GetCommissionId() != id {
		t.Fatalf("quick plan %v", p)
	}
	if _, err := h.msrv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{}); err == nil {
		t.Fatal("allocated while commissioning")
	}
	sendTest(t, a, id, &inventoryv1.CommissionTest{Name: "memtester", Result: "pass", Summary: "16 MiB x1: 18 tests ok"}, false, "")
	sendTest(t, a, id, nil, true, "")
	h.eventually(a.name, "passed", func(m *inventoryv1.Machine) bool { return m.GetCommission().GetStatus() == inventory.CommissionPassed })
	if _, err := h.msrv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{}); err != nil {
		t.Fatalf("allocate after a pass: %v", err)
	}
	if _, err := csrv.ClearCommission(ctx, &inventoryv1.ClearCommissionRequest{Name: a.name}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("clear of a pass: %v", err)
	}

	// One whose agent never reports is abandoned by a clear, and its
	// late report is dropped.
	r := h.msrv
	if _, err := r.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: a.name}); err != nil {
		t.Fatal(err)
	}
	m, err = csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name})
	if err != nil {
		t.Fatal(err)
	}
	id = m.GetCommission().GetCommissionId()
	a.next()
	m, err = csrv.ClearCommission(ctx, &inventoryv1.ClearCommissionRequest{Name: a.name})
	if err != nil || m.GetCommission().GetStatus() != inventory.CommissionFailed || !m.GetCommission().GetCleared() ||
		!strings.HasPrefix(m.GetCommission().GetError(), "abandoned by ") {
		t.Fatalf("clear of a running commissioning: %v %v", m.GetCommission(), err)
	}
	sendTest(t, a, id, nil, true, "")
	if _, err := h.msrv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{}); err != nil {
		t.Fatalf("allocate after an abandoned commissioning: %v", err)
	}
}

// TestCommissionStall: a commissioning whose agent goes silent is failed
// after CommissionStall from its last sign of life (the delivery, then each
// test reported), saying what was last heard, and the machine stays held;
// one never delivered is failed saying so.
func TestCommissionStall(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	csrv := &inventory.CommissionServer{Inv: h.inv, Lifecycle: h.lc}
	m, err := csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name})
	if err != nil {
		t.Fatal(err)
	}
	id := m.GetCommission().GetCommissionId()
	a.next()
	h.eventually(a.name, "running", func(m *inventoryv1.Machine) bool { return m.GetCommission().GetSentAt() != nil })
	h.reconcile()
	a.none() // delivered once: a reconcile does not send it again
	h.clk.Advance(DefaultCommissionStall - time.Minute)
	sendTest(t, a, id, &inventoryv1.CommissionTest{Name: "memtester", Result: "pass"}, false, "")
	h.eventually(a.name, "one test", func(m *inventoryv1.Machine) bool { return len(m.GetCommission().GetTests()) == 1 })
	// The agent dies.
	a.close()
	h.eventually(a.name, "disconnected", func(*inventoryv1.Machine) bool { _, ok := h.lc.sess.connectedSince(a.name); return !ok })
	h.clk.Advance(DefaultCommissionStall - time.Minute) // over an hour since delivery, less since the test
	h.reconcile()
	if s := h.machine(a.name).GetCommission().GetStatus(); s != inventory.CommissionRunning {
		t.Fatalf("commissioning %s before its stall bound from the last test", s)
	}
	h.clk.Advance(2 * time.Minute)
	h.reconcile()
	c := h.machine(a.name).GetCommission()
	if c.GetStatus() != inventory.CommissionFailed || !strings.Contains(c.GetError(), "stalled: nothing reported for 1h0m0s after 1 tests (last: memtester)") || c.GetFinishedAt() == nil {
		t.Fatalf("stalled commissioning: %v", c)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("accept after a stalled commissioning: %v", err)
	}

	// Never delivered: no agent is connected when it is requested.
	if _, err := csrv.ClearCommission(ctx, &inventoryv1.ClearCommissionRequest{Name: a.name}); err != nil {
		t.Fatal(err)
	}
	if _, err := csrv.CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: a.name}); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(DefaultCommissionStall + time.Second)
	h.reconcile()
	if c := h.machine(a.name).GetCommission(); c.GetStatus() != inventory.CommissionFailed || !strings.Contains(c.GetError(), "not delivered within 1h0m0s") {
		t.Fatalf("undelivered commissioning: %v", c)
	}
}
