package main

// Attack test for commissioning results (docs/operator-guide.md,
// "Commissioning"): what an agent reports of its tests is the machine's
// word, so a machine on the boot LAN can send anything. Against the built
// corrald: the agent edge with the machine's own per-boot token over TLS,
// the built corral for the operator.

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// TestAttackCommissionResults: an agent answers a commissioning plan with
// more tests than the cap, outputs far over their bound and laden with
// terminal escapes, a test the plan does not have and a result that is
// not one, then claims success. At most MaxCommissionTests are kept, each
// output within its bound, the unknown test and the bad result stored as
// failures, so the verdict is failed whatever the agent said; describe and
// the timeline print no raw control character; the machine is refused for
// accept until an operator clears it.
func TestAttackCommissionResults(t *testing.T) {
	c := startCredCorrald(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const mac, from = "52:54:00:cc:22:01", "127.0.3.21"
	agent := c.agent(c.token(mac, from))
	reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: machinefacts.QEMU("SN-COMM-1", "", mac)})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	name := reg.GetMachineName()
	conf := filepath.Join(t.TempDir(), "admin.conf")
	if err := c.cc.Write(conf); err != nil {
		t.Fatal(err)
	}
	corral := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "corral"), append([]string{"--config", conf}, args...)...).CombinedOutput()
		return string(out), err
	}

	stream, err := agent.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	beat := &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: reg.GetSessionId()}}}
	if err := stream.Send(beat); err != nil {
		t.Fatal(err)
	}
	if out, err := corral("machine", "commission", name, "--profile", "quick"); err != nil {
		t.Fatalf("corral machine commission: %v\n%s", err, out)
	}
	var plan *nodev1.CommissionPlan
	for plan == nil {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for the commissioning plan: %v", err)
		}
		plan = m.GetCommission()
	}
	if len(plan.GetSteps()) == 0 {
		t.Fatalf("plan without steps: %v", plan)
	}
	kind := plan.GetSteps()[0].GetKind()
	send := func(p *nodev1.Progress) {
		t.Helper()
		p.InstallId = plan.GetCommissionId()
		if err := stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: p}}); err != nil {
			t.Fatal(err)
		}
	}
	evil := escTitle + escClear + escClipboard
	send(&nodev1.Progress{Step: "test", CommissionTest: &inventoryv1.CommissionTest{Name: "rm-rf" + evil, Result: "pass", Summary: "not in the plan"}})
	send(&nodev1.Progress{Step: "test", CommissionTest: &inventoryv1.CommissionTest{Name: kind, Result: "PASS" + evil, Summary: "a made-up result"}})
	for i := range inventory.MaxCommissionTests + 10 {
		send(&nodev1.Progress{Step: "test", CommissionTest: &inventoryv1.CommissionTest{
			Name: kind, Target: fmt.Sprintf("/dev/x%d", i), Result: "pass",
			Summary: "ok" + evil, Output: strings.Repeat("A"+evil, 2000), DurationMs: -5,
		}})
	}
	send(&nodev1.Progress{Step: "commissioned", Done: true})

	var m *inventoryv1.Machine
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		m = c.machine(name)
		if s := m.GetCommission().GetStatus(); s != inventory.CommissionPending && s != inventory.CommissionRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commissioning still %s after a minute (%d tests stored)", m.GetCommission().GetStatus(), len(m.GetCommission().GetTests()))
		}
	}
	cm := m.GetCommission()
	if cm.GetStatus() != inventory.CommissionFailed {
		t.Errorf("verdict %q after an unknown test and a bad result; want %q", cm.GetStatus(), inventory.CommissionFailed)
	}
	if n := len(cm.GetTests()); n != inventory.MaxCommissionTests {
		t.Errorf("%d tests stored, want the cap %d", n, inventory.MaxCommissionTests)
	}
	for i, ts := range cm.GetTests() {
		if len(ts.GetOutput()) > inventory.MaxCommissionOutput || ts.GetDurationMs() < 0 {
			t.Errorf("test %d: output %d bytes, duration %d", i, len(ts.GetOutput()), ts.GetDurationMs())
		}
	}
	if r := cm.GetTests()[0].GetResult(); r != "fail" {
		t.Errorf("a test the plan does not have stored as %q, want fail", r)
	}
	if r := cm.GetTests()[1].GetResult(); r != "fail" {
		t.Errorf("result %q stored as %q, want fail", "PASS"+evil, r)
	}

	for _, args := range [][]string{{"describe", "machine", name}, {"machine", "timeline", name}, {"get", "machines"}} {
		out, err := corral(args...)
		if err != nil {
			t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		assertNoRaw(t, "corral "+strings.Join(args, " "), out)
	}
	if out, err := corral("machine", "accept", name, "--target", "pool"); err == nil || !strings.Contains(out, "failed commissioning") {
		t.Errorf("accept of a machine whose agent claimed success over failed tests: %v\n%s", err, out)
	}
	assertNoRaw(t, "corrald's log", c.logs.String())
}
