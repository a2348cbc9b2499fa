package lifecycle

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/bolt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
)

var (
	alice    = inventory.Owner{ID: "token:alice", Name: "alice"}
	bob      = inventory.Owner{ID: "token:bob", Name: "bob"}
	operator = inventory.Owner{ID: "token:op", Name: "op", Operator: true}
)

// poolLevels is a standby pools' erase policy.
type poolLevels map[string]inventoryv1.EraseLevel

func (p poolLevels) EraseLevel(pool string) inventoryv1.EraseLevel { return p[pool] }

// eraseCounts records Config.EraseDone.
type eraseCounts struct {
	mu  sync.Mutex
	got []string
}

func (c *eraseCounts) done(level, outcome string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, level+"/"+outcome)
}

func (c *eraseCounts) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// wait returns the counts once there are n (counted after the mutation
// the test sees), or after 5 s.
func (c *eraseCounts) wait(n int) []string {
	deadline := time.Now().Add(5 * time.Second)
	for len(c.list()) < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return c.list()
}

// eraseHarness is a harness on a bolt store whose machine m1 (registered
// by its agent, which is then disconnected) is READY in pool "ci" and
// allocated to alice, with servers for alice, bob and an operator.
type eraseHarness struct {
	*harness
	name   string
	counts *eraseCounts
	as     func(o inventory.Owner) *inventory.MachineServer
}

func newEraseHarness(t *testing.T, expires time.Duration) *eraseHarness {
	t.Helper()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := newHarness(t, st, harnessOpt{})
	counts := &eraseCounts{}
	h.lc.cfg.EraseDone = counts.done
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	a.close()
	h.eventually(a.name, "disconnected", func(*inventoryv1.Machine) bool { return !h.lc.sess.connected(a.name) })
	if _, err := h.inv.LabelMachine(ctx, a.name, inventory.LabelChange{Set: map[string]string{inventory.PoolKey: "ci"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); err != nil {
		t.Fatal(err)
	}
	as := func(o inventory.Owner) *inventory.MachineServer {
		return &inventory.MachineServer{Inv: h.inv, Lifecycle: h.lc, Caller: func(context.Context) inventory.Owner { return o }}
	}
	req := &inventoryv1.AllocateMachinesRequest{Pool: "ci"}
	if expires > 0 {
		req.ExpiresIn = durationpb.New(expires)
	}
	if _, err := as(alice).AllocateMachines(ctx, req); err != nil {
		t.Fatal(err)
	}
	return &eraseHarness{harness: h, name: a.name, counts: counts, as: as}
}

// events is the machine's timeline as "event: detail" lines.
func (h *eraseHarness) events() []string {
	h.t.Helper()
	ctx := context.Background()
	if err := h.inv.FlushTimeline(ctx); err != nil {
		h.t.Fatal(err)
	}
	es, err := h.inv.Timeline(ctx, h.name, "", 100)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.GetEvent()+": "+e.GetDetail())
	}
	return out
}

// hasEvent polls the timeline for an entry starting with prefix, for up
// to 5 s (entries follow the mutations the test waits for).
func (h *eraseHarness) hasEvent(prefix string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if slices.ContainsFunc(h.events(), func(e string) bool { return strings.HasPrefix(e, prefix) }) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var vdisks = []string{"/dev/vda", "/dev/vdb"}

// TestReleaseEraseFull: the owner releases with a full erase: RELEASING
// with the pending erase of every disk and the allocation ended; the plan
// goes to the agent when it connects; its progress lands on the record;
// "erased" makes the machine READY, allocatable again.
func TestReleaseEraseFull(t *testing.T) {
	h := newEraseHarness(t, 0)
	ctx := context.Background()
	m, err := h.as(alice).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
	if err != nil {
		t.Fatal(err)
	}
	e := m.GetErase()
	if m.GetState() != inventoryv1.Machine_RELEASING || e.GetLevel() != inventoryv1.EraseLevel_ERASE_LEVEL_FULL ||
		!slices.Equal(e.GetDisks(), vdisks) || !strings.HasPrefix(e.GetEraseId(), inventory.EraseIDPrefix) || e.GetRequestedAt() == nil || e.GetSentAt() != nil {
		t.Fatalf("released: %s %v", m.GetState(), e)
	}
	if a := m.GetAllocation(); a.GetReleasedAt() == nil || a.GetReleaseReason() != "released by its owner" {
		t.Fatalf("allocation %v", a)
	}
	if m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER {
		t.Fatalf("boot intent %s", m.GetBootIntent())
	}
	if !h.hasEvent("erase-waiting: waiting: network-boot the machine") {
		t.Fatalf("timeline %q", h.events())
	}
	// No BMC: nothing was power-cycled.
	if boots, actions := h.bmc.log(); len(boots)+len(actions) != 0 {
		t.Fatalf("BMC used: %v %v", boots, actions)
	}
	a := h.connect(mac1, facts("S1", "", mac1))
	plan := a.next().GetErase()
	want := &nodev1.ErasePlan{EraseId: e.GetEraseId(), Level: inventoryv1.EraseLevel_ERASE_LEVEL_FULL, Disks: vdisks}
	if diff := cmp.Diff(want, plan, protocmp.Transform()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	h.eventually(h.name, "sent", func(m *inventoryv1.Machine) bool { return m.GetErase().GetSentAt() != nil })
	a.progress("erase-0000000000000000", "erased", true, "") // another erase's: dropped
	a.progress(e.GetEraseId(), "erase", false, "")
	sendDetail(t, a, e.GetEraseId(), "/dev/vda: discarded (1 of 2)")
	h.eventually(h.name, "at vda", func(m *inventoryv1.Machine) bool {
		return m.GetErase().GetDetail() == "/dev/vda: discarded (1 of 2)"
	})
	if got := h.machine(h.name).GetState(); got != inventoryv1.Machine_RELEASING {
		t.Fatalf("after a stale erased: %s", got)
	}
	a.progress(e.GetEraseId(), "erased", true, "")
	m = h.eventually(h.name, "READY", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_READY })
	if m.GetErase().GetFinishedAt() == nil || m.GetErase().GetError() != "" || m.GetErase().GetStep() != "erased" || m.GetStateReason() != "" {
		t.Fatalf("erased: %v reason %q", m.GetErase(), m.GetStateReason())
	}
	if !h.hasEvent("erased: erased: full on /dev/vda, /dev/vdb") || !h.hasEvent("erase-progress: erase: /dev/vda") {
		t.Fatalf("timeline %q", h.events())
	}
	if got := h.counts.wait(1); !slices.Equal(got, []string{"full/ok"}) {
		t.Fatalf("counted %v", got)
	}
	if _, err := h.as(bob).AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Pool: "ci"}); err != nil {
		t.Fatalf("allocate after the erase: %v", err)
	}
}

func sendDetail(t *testing.T, a *agent, id, detail string) {
	t.Helper()
	if err := a.stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: &nodev1.Progress{
		InstallId: id, Step: "erase", Detail: detail}}}); err != nil {
		t.Fatal(err)
	}
}

// TestEraseFailureAndRetry: an erase that fails leaves the machine FAILED
// with the reason, not allocatable and not to be put back in its pool;
// its former owner cannot erase it again, an operator can (with a level),
// and that erase makes it READY.
func TestEraseFailureAndRetry(t *testing.T) {
	h := newEraseHarness(t, 0)
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	a.none()
	m, err := h.as(alice).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_SECURE})
	if err != nil {
		t.Fatal(err)
	}
	// The agent is connected: the plan goes at once.
	if p := a.next().GetErase(); p.GetEraseId() != m.GetErase().GetEraseId() || p.GetLevel() != inventoryv1.EraseLevel_ERASE_LEVEL_SECURE {
		t.Fatalf("plan %v", p)
	}
	a.progress(m.GetErase().GetEraseId(), "erase", true, "/dev/vda: has no secure erase of its own; use --erase full")
	m = h.eventually(h.name, "FAILED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_FAILED })
	if m.GetStateReason() != "erase: /dev/vda: has no secure erase of its own; use --erase full" || m.GetErase().GetFinishedAt() == nil {
		t.Fatalf("failed: %q %v", m.GetStateReason(), m.GetErase())
	}
	if got := h.counts.wait(1); !slices.Equal(got, []string{"secure/failed"}) {
		t.Fatalf("counted %v", got)
	}
	if _, err := h.as(bob).AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Pool: "ci"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("allocate a machine whose erase failed: %v", err)
	}
	if _, err := h.inv.AcceptToPool(ctx, h.name); !errors.Is(err, inventory.ErrInvalidTransition) || !strings.Contains(err.Error(), "failed its erase") {
		t.Fatalf("back to the pool after a failed erase: %v", err)
	}
	if _, err := h.as(alice).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the former owner erases again: %v", err)
	}
	if _, err := h.as(operator).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "--erase") {
		t.Fatalf("erase again without a level: %v", err)
	}
	m, err = h.as(operator).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_RELEASING || m.GetErase().GetError() != "" || m.GetAllocation().GetReleasedBy() != alice.ID {
		t.Fatalf("erase again: %s %v %v", m.GetState(), m.GetErase(), m.GetAllocation())
	}
	id := a.next().GetErase().GetEraseId()
	if id != m.GetErase().GetEraseId() {
		t.Fatalf("plan %s, erase %s", id, m.GetErase().GetEraseId())
	}
	a.progress(id, "erased", true, "")
	h.eventually(h.name, "READY", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_READY })
	if !h.hasEvent("releasing: erase again by token:op") {
		t.Fatalf("timeline %q", h.events())
	}
}

// TestReleaseRefusals: a user releases only its own machine; an unknown
// erase level is InvalidArgument; the record is unchanged.
func TestReleaseRefusals(t *testing.T) {
	h := newEraseHarness(t, 0)
	ctx := context.Background()
	before := h.machine(h.name)
	if _, err := h.as(bob).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("bob releases alice's machine: %v", err)
	}
	if _, err := h.as(alice).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel(42)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown level: %v", err)
	}
	if diff := cmp.Diff(before, h.machine(h.name), protocmp.Transform()); diff != "" {
		t.Fatalf("record changed (-before +after):\n%s", diff)
	}
}

// TestReleaseNoneIsReady: a release without an erase (NONE, or DEFAULT
// in a pool that does not erase) is READY at once, as before erases.
func TestReleaseNoneIsReady(t *testing.T) {
	for name, tc := range map[string]struct {
		level  inventoryv1.EraseLevel
		policy poolLevels
	}{
		"none":              {level: inventoryv1.EraseLevel_ERASE_LEVEL_NONE, policy: poolLevels{"ci": inventoryv1.EraseLevel_ERASE_LEVEL_FULL}},
		"default, no pool":  {},
		"default, pool not": {policy: poolLevels{"other": inventoryv1.EraseLevel_ERASE_LEVEL_FULL}},
	} {
		t.Run(name, func(t *testing.T) {
			h := newEraseHarness(t, 0)
			if tc.policy != nil {
				h.lc.SetErasePolicy(tc.policy)
			}
			m, err := h.as(alice).ReleaseMachine(context.Background(), &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: tc.level})
			if err != nil {
				t.Fatal(err)
			}
			if m.GetState() != inventoryv1.Machine_READY || m.GetErase() != nil || m.GetAllocation().GetReleasedAt() == nil {
				t.Fatalf("released: %s %v", m.GetState(), m.GetErase())
			}
		})
	}
}

// TestReleaseDefaultTakesPoolLevel: DEFAULT is the pool's level; with a
// BMC the machine is power-cycled into discovery, and powered off once
// erased.
func TestReleaseDefaultTakesPoolLevel(t *testing.T) {
	h := newEraseHarness(t, 0)
	h.lc.SetErasePolicy(poolLevels{"ci": inventoryv1.EraseLevel_ERASE_LEVEL_QUICK})
	enrollBMC(t, h.harness, h.name)
	m, err := h.as(alice).ReleaseMachine(context.Background(), &inventoryv1.ReleaseMachineRequest{Name: h.name})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_RELEASING || m.GetErase().GetLevel() != inventoryv1.EraseLevel_ERASE_LEVEL_QUICK {
		t.Fatalf("released: %s %v", m.GetState(), m.GetErase())
	}
	boots, actions := h.bmc.log()
	if len(boots) != 1 || boots[0].Device != inventoryv1.BootDevice_BOOT_DEVICE_PXE || !slices.Equal(actions, []inventoryv1.PowerAction{inventoryv1.PowerAction_POWER_ACTION_CYCLE}) {
		t.Fatalf("BMC: %v %v", boots, actions)
	}
	a := h.connect(mac1, facts("S1", "", mac1))
	id := a.next().GetErase().GetEraseId()
	a.progress(id, "erased", true, "")
	h.eventually(h.name, "READY", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_READY })
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, actions = h.bmc.log()
		if slices.Contains(actions, inventoryv1.PowerAction_POWER_ACTION_OFF) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never powered off: %v", actions)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReleaseDeployedBootsDiscovery: a machine that had an OS deployed
// boots discovery after a release: next boot PXE, persistently (the
// deploy made its disk the persistent next boot), power-cycled when it is
// to be erased; its deployment is closed.
func TestReleaseDeployedBootsDiscovery(t *testing.T) {
	for name, tc := range map[string]struct {
		level   inventoryv1.EraseLevel
		state   inventoryv1.Machine_MachineState
		actions []inventoryv1.PowerAction
	}{
		"none": {level: inventoryv1.EraseLevel_ERASE_LEVEL_NONE, state: inventoryv1.Machine_READY},
		"full": {level: inventoryv1.EraseLevel_ERASE_LEVEL_FULL, state: inventoryv1.Machine_RELEASING,
			actions: []inventoryv1.PowerAction{inventoryv1.PowerAction_POWER_ACTION_CYCLE}},
	} {
		t.Run(name, func(t *testing.T) {
			h := newEraseHarness(t, 0)
			enrollBMC(t, h.harness, h.name)
			ctx := context.Background()
			if _, err := h.inv.UpdateMachine(ctx, h.name, func(m *inventoryv1.Machine) error {
				m.State = inventoryv1.Machine_DEPLOYED
				m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
				m.Deployment = &inventoryv1.Deployment{DeploymentId: "d1", OsImage: "debian"}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			m, err := h.as(alice).ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: tc.level})
			if err != nil {
				t.Fatal(err)
			}
			if m.GetState() != tc.state || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER || m.GetDeployment() != nil {
				t.Fatalf("released: %s %s %v", m.GetState(), m.GetBootIntent(), m.GetDeployment())
			}
			boots, actions := h.bmc.log()
			if len(boots) != 1 || boots[0].Device != inventoryv1.BootDevice_BOOT_DEVICE_PXE || !boots[0].Persistent || !slices.Equal(actions, tc.actions) {
				t.Fatalf("BMC: %v %v", boots, actions)
			}
		})
	}
}

// TestExpiryErasesAtPoolLevel: an expired allocation in a pool that
// erases goes RELEASING, and its owner reads why.
func TestExpiryErasesAtPoolLevel(t *testing.T) {
	h := newEraseHarness(t, time.Hour)
	h.lc.SetErasePolicy(poolLevels{"ci": inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
	h.clk.Advance(time.Hour)
	h.reconcile()
	m, err := h.as(alice).GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: h.name})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_RELEASING || m.GetErase().GetLevel() != inventoryv1.EraseLevel_ERASE_LEVEL_FULL ||
		!strings.HasPrefix(m.GetAllocation().GetReleaseReason(), "allocation expired at ") || m.GetAllocation().GetReleasedBy() != ExpiryOwner {
		t.Fatalf("expired: %s %v %v", m.GetState(), m.GetErase(), m.GetAllocation())
	}
	if !h.hasEvent("expired: allocation of token:alice (alice) ended: allocation expired at") {
		t.Fatalf("timeline %q", h.events())
	}
}

// TestEraseTimeouts: an erase whose plan never reaches an agent fails
// after EraseStall; one that keeps reporting fails after EraseTimeout.
func TestEraseTimeouts(t *testing.T) {
	t.Run("stall", func(t *testing.T) {
		h := newEraseHarness(t, 0)
		if _, err := h.as(alice).ReleaseMachine(context.Background(), &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_QUICK}); err != nil {
			t.Fatal(err)
		}
		h.clk.Advance(DefaultEraseStall)
		h.reconcile()
		if m := h.machine(h.name); m.GetState() != inventoryv1.Machine_RELEASING {
			t.Fatalf("at the stall bound: %s", m.GetState())
		}
		h.clk.Advance(time.Second)
		h.reconcile()
		m := h.machine(h.name)
		if m.GetState() != inventoryv1.Machine_FAILED || !strings.Contains(m.GetStateReason(), "erase: timeout: no progress within 30m0s: the plan was never delivered") {
			t.Fatalf("stalled: %s %q", m.GetState(), m.GetStateReason())
		}
		if _, err := h.inv.AcceptToPool(context.Background(), h.name); err == nil {
			t.Fatal("a timed-out erase went back to the pool")
		}
		if got := h.counts.list(); !slices.Equal(got, []string{"quick/timeout"}) {
			t.Fatalf("counted %v", got)
		}
	})
	t.Run("total", func(t *testing.T) {
		h := newEraseHarness(t, 0)
		a := h.connect(mac1, facts("S1", "", mac1))
		a.none()
		_, err := h.as(alice).ReleaseMachine(context.Background(), &inventoryv1.ReleaseMachineRequest{Name: h.name, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
		if err != nil {
			t.Fatal(err)
		}
		id := a.next().GetErase().GetEraseId()
		for i := 0; i < 18; i++ { // 6 h of reports every 20 min
			h.clk.Advance(20 * time.Minute)
			sendDetail(t, a, id, "/dev/vdb: zeroing")
			at := h.clk.Now()
			h.eventually(h.name, "progress", func(m *inventoryv1.Machine) bool { return !m.GetErase().GetUpdatedAt().AsTime().Before(at) })
			h.reconcile()
		}
		if m := h.machine(h.name); m.GetState() != inventoryv1.Machine_RELEASING {
			t.Fatalf("at 6h: %s %q", m.GetState(), m.GetStateReason())
		}
		h.clk.Advance(time.Minute)
		h.reconcile()
		m := h.machine(h.name)
		if m.GetState() != inventoryv1.Machine_FAILED || !strings.HasPrefix(m.GetStateReason(), "erase: timeout: not finished within 6h0m0s (last step: erase (/dev/vdb: zeroing))") {
			t.Fatalf("after 6h: %s %q", m.GetState(), m.GetStateReason())
		}
		// A late report of that erase changes nothing.
		a.progress(id, "erased", true, "")
		a.none()
		if m := h.machine(h.name); m.GetState() != inventoryv1.Machine_FAILED {
			t.Fatalf("late erased: %s", m.GetState())
		}
	})
}

// TestExpiryOfADeployedMachine: an allocation expires whatever its owner
// did with the machine: a DEPLOYED one is released (and erased at its
// pool's level) too.
func TestExpiryOfADeployedMachine(t *testing.T) {
	h := newEraseHarness(t, time.Hour)
	h.lc.SetErasePolicy(poolLevels{"ci": inventoryv1.EraseLevel_ERASE_LEVEL_QUICK})
	if _, err := h.inv.UpdateMachine(context.Background(), h.name, func(m *inventoryv1.Machine) error {
		m.State = inventoryv1.Machine_DEPLOYED
		m.Deployment = &inventoryv1.Deployment{DeploymentId: "d1"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(time.Hour)
	h.reconcile()
	m := h.machine(h.name)
	if m.GetState() != inventoryv1.Machine_RELEASING || m.GetDeployment() != nil || !strings.HasPrefix(m.GetAllocation().GetReleaseReason(), "allocation expired at ") {
		t.Fatalf("expired: %s %v %v", m.GetState(), m.GetDeployment(), m.GetAllocation())
	}
}
