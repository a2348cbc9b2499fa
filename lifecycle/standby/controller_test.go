package standby

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/lifecycle"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/testsupport/fakeclock"
)

// fakeBMC records power actions: "NAME pxe", "NAME on", "NAME off".
type fakeBMC struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeBMC) SetBootDevice(_ context.Context, name string, req inventory.BootRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Device == inventoryv1.BootDevice_BOOT_DEVICE_PXE {
		f.calls = append(f.calls, name+" pxe")
	}
	return nil
}

func (f *fakeBMC) SetPower(_ context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch a {
	case inventoryv1.PowerAction_POWER_ACTION_ON:
		f.calls = append(f.calls, name+" on")
	case inventoryv1.PowerAction_POWER_ACTION_OFF:
		f.calls = append(f.calls, name+" off")
	default:
		f.calls = append(f.calls, name+" "+a.String())
	}
	return &inventoryv1.PowerStatus{}, nil
}

func (f *fakeBMC) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

type stubIdentity struct{}

func (stubIdentity) SignNode(context.Context, string, []byte) ([]byte, error) { return nil, nil }
func (stubIdentity) CACertPEM() []byte                                        { return nil }

// agents is the fake discovery-agent sessions.
type agents struct {
	mu sync.Mutex
	on map[string]bool
}

func (a *agents) set(name string, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.on[name] = on
}

func (a *agents) connected(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.on[name]
}

// appliance is one appliance's inventory, lifecycle and controller on a
// shared store.
type appliance struct {
	inv   *inventory.Inventory
	bmc   *fakeBMC
	pools *Service
	ctrl  *Controller
}

type rig struct {
	t      *testing.T
	st     store.Store
	clk    *fakeclock.Clock
	agents *agents
}

func newRig(t *testing.T) *rig {
	t.Helper()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &rig{t: t, st: st, clk: fakeclock.New(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)), agents: &agents{on: map[string]bool{}}}
}

func (r *rig) appliance(interval time.Duration) *appliance {
	t := r.t
	t.Helper()
	inv, err := inventory.New(inventory.Config{Store: r.st, Now: r.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(pool.Config{Store: r.st, Now: r.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBMC{}
	lc, err := lifecycle.New(lifecycle.Config{Machines: inv, Events: inv, Nodes: p, Identity: stubIdentity{}, BMC: b, Now: r.clk.Now, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(r.st, r.clk.Now, nil)
	ctrl, err := NewController(Config{Pools: svc, Machines: inv, Power: lc, Agents: r.agents.connected, Now: r.clk.Now, Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	return &appliance{inv: inv, bmc: b, pools: svc, ctrl: ctrl}
}

func (a *appliance) create(t *testing.T, state inventoryv1.Machine_MachineState, names ...string) {
	t.Helper()
	for _, n := range names {
		m := &inventoryv1.Machine{Name: n, State: state, Pool: "ci", BootMac: macOf(n), Labels: map[string]string{"id": n},
			Bmc: &inventoryv1.Bmc{Address: "10.9.0." + n[len(n)-1:], Username: "admin"}}
		if _, err := a.inv.CreateMachine(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

func macOf(name string) string { return "52:54:00:00:00:0" + name[len(name)-1:] }

// allocate allocates machine name of pool ci to a user.
func allocate(t *testing.T, a *appliance, name string) {
	t.Helper()
	ms, err := a.inv.AllocateMachines(context.Background(), inventory.Owner{ID: "token:u1"}, inventory.AllocateRequest{Selector: "label.id=" + name, Pool: "ci"})
	if err != nil || len(ms) != 1 || ms[0].GetName() != name {
		t.Fatalf("allocate %s: %v, %v", name, ms, err)
	}
}

func (a *appliance) apply(t *testing.T, p *inventoryv1.StandbyPool) {
	t.Helper()
	if _, err := a.pools.Apply(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

func (a *appliance) pass(t *testing.T) {
	t.Helper()
	if err := a.ctrl.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (a *appliance) states(t *testing.T) map[string]inventoryv1.Machine_MachineState {
	t.Helper()
	ms, err := a.inv.ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]inventoryv1.Machine_MachineState{}
	for _, m := range ms {
		out[m.GetName()] = m.GetState()
	}
	return out
}

func (a *appliance) status(t *testing.T, name string) *inventoryv1.StandbyPoolStatus {
	t.Helper()
	p, err := a.pools.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return p.GetStatus()
}

func count(states map[string]inventoryv1.Machine_MachineState, want inventoryv1.Machine_MachineState) int {
	n := 0
	for _, s := range states {
		if s == want {
			n++
		}
	}
	return n
}

// TestAutoAcceptHoldsAndRefills: min_ready 1 with auto_accept takes one
// INVENTORIED machine of the pool and holds it (a second pass accepts no
// more); once it is allocated the pool refills with another, and the
// allocated machine is never powered.
func TestAutoAcceptHoldsAndRefills(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.create(t, inventoryv1.Machine_INVENTORIED, "m1", "m2", "m3")
	a.apply(t, &inventoryv1.StandbyPool{Name: "ci", MinReady: 1, Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF, AutoAccept: true})

	a.pass(t)
	a.pass(t)
	st := a.states(t)
	if st["m1"] != inventoryv1.Machine_READY || count(st, inventoryv1.Machine_READY) != 1 {
		t.Fatalf("after two passes: %v, want m1 READY and no other", st)
	}
	if s := a.status(t, "ci"); s.GetReady() != 1 || s.GetDeficit() != 0 || s.GetLastAction() != "accepted m1" {
		t.Errorf("status %v, want ready 1, deficit 0, last action accepted m1", s)
	}

	allocate(t, a, "m1")
	a.pass(t)
	st = a.states(t)
	if st["m1"] != inventoryv1.Machine_ALLOCATED || st["m2"] != inventoryv1.Machine_READY || st["m3"] != inventoryv1.Machine_INVENTORIED {
		t.Fatalf("after the allocation: %v, want m1 ALLOCATED, m2 READY (the refill), m3 INVENTORIED", st)
	}
	if s := a.status(t, "ci"); s.GetReady() != 1 || s.GetAllocated() != 1 || s.GetDeficit() != 0 {
		t.Errorf("status %v, want ready 1, allocated 1, deficit 0", s)
	}
	if c := a.bmc.take(); len(c) != 0 {
		t.Errorf("power actions %v: none expected (nothing reads ON, no agent)", c)
	}
}

// TestBootedPowersOn: a BOOTED pool powers one READY machine on into
// discovery (PXE, then on, its boot watchdog armed) and not a second while
// it boots; its agent's session makes it booted; a lower target powers it
// off again.
func TestBootedPowersOn(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.create(t, inventoryv1.Machine_READY, "m1", "m2")
	spec := &inventoryv1.StandbyPool{Name: "ci", MinReady: 1, Readiness: inventoryv1.Readiness_READINESS_BOOTED}
	a.apply(t, spec)

	a.pass(t)
	if got, want := a.bmc.take(), []string{"m1 pxe", "m1 on"}; !slices.Equal(got, want) {
		t.Fatalf("power actions %v, want %v", got, want)
	}
	m, _ := a.inv.GetMachine(context.Background(), "m1")
	if w := m.GetWatchdog(); w.GetArmedAt() == nil || w.GetArmedBy() != "standby pool ci" || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER {
		t.Errorf("m1 watchdog %v, boot intent %v: want armed by the pool, DISCOVER", w, m.GetBootIntent())
	}
	if s := a.status(t, "ci"); s.GetBooted() != 0 || s.GetDeficit() != 1 || s.GetWarming() != 1 || !slices.Equal(s.GetReadyMachines(), []string{"m1", "m2"}) {
		t.Errorf("status while booting %v, want booted 0, warming 1, deficit 1, machines m1 m2", s)
	}
	a.pass(t)
	if c := a.bmc.take(); len(c) != 0 {
		t.Fatalf("second pass while m1 boots: %v, want nothing", c)
	}

	r.agents.set("m1", true)
	a.pass(t)
	if s := a.status(t, "ci"); s.GetBooted() != 1 || s.GetDeficit() != 0 || s.GetReady() != 2 || s.GetWarming() != 0 {
		t.Errorf("status once booted %v, want ready 2, booted 1, warming 0, deficit 0", s)
	}
	if c := a.bmc.take(); len(c) != 0 {
		t.Fatalf("pass at the target: %v, want nothing", c)
	}

	spec.MinReady = 0
	a.apply(t, spec)
	a.pass(t)
	if got, want := a.bmc.take(), []string{"m1 off"}; !slices.Equal(got, want) {
		t.Fatalf("beyond the target: %v, want %v", got, want)
	}
}

// TestPoweredOffPowersOff: a POWERED_OFF pool powers off READY machines
// the BMC reads ON, one whose agent is connected only after the grace,
// and never an allocated machine.
func TestPoweredOffPowersOff(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.create(t, inventoryv1.Machine_READY, "m1", "m2", "m3")
	ctx := context.Background()
	for _, n := range []string{"m1", "m3"} {
		if _, err := a.inv.UpdateMachine(ctx, n, func(m *inventoryv1.Machine) error {
			m.PowerState = inventoryv1.PowerState_POWER_STATE_ON
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	allocate(t, a, "m1")
	r.agents.set("m2", true)
	a.apply(t, &inventoryv1.StandbyPool{Name: "ci", MinReady: 2, Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF})

	a.pass(t)
	if got, want := a.bmc.take(), []string{"m3 off"}; !slices.Equal(got, want) {
		t.Fatalf("first pass: %v, want %v (m1 is allocated, m2's agent within the grace)", got, want)
	}
	// The BMC poller reads m3 off.
	if _, err := a.inv.UpdateMachine(ctx, "m3", func(m *inventoryv1.Machine) error {
		m.PowerState = inventoryv1.PowerState_POWER_STATE_OFF
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.clk.Advance(DefaultOffGrace + time.Second)
	a.pass(t)
	if got, want := a.bmc.take(), []string{"m2 off"}; !slices.Equal(got, want) {
		t.Fatalf("after the grace: %v, want %v", got, want)
	}
	if st := a.states(t); st["m1"] != inventoryv1.Machine_ALLOCATED {
		t.Errorf("m1 %v, want ALLOCATED", st["m1"])
	}
}

// TestNeverTouchesHeldMachines: machines ALLOCATED, MAINTENANCE or
// CONFLICT in a BOOTED pool are never powered, even below the target.
func TestNeverTouchesHeldMachines(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.create(t, inventoryv1.Machine_MAINTENANCE, "m1")
	a.create(t, inventoryv1.Machine_CONFLICT, "m2")
	a.create(t, inventoryv1.Machine_READY, "m3")
	allocate(t, a, "m3")
	a.apply(t, &inventoryv1.StandbyPool{Name: "ci", MinReady: 3, Readiness: inventoryv1.Readiness_READINESS_BOOTED, AutoAccept: true})
	a.pass(t)
	if c := a.bmc.take(); len(c) != 0 {
		t.Fatalf("power actions %v, want none", c)
	}
	if s := a.status(t, "ci"); s.GetDeficit() != 3 || s.GetAllocated() != 1 || len(s.GetConditions()) == 0 {
		t.Errorf("status %v, want deficit 3, allocated 1 and a condition", s)
	}
}

// election is a fake leader election, as appliance's Leadership: Lead
// blocks until name is made leader and returns a context that ends when
// it is not any more.
type election struct {
	mu     sync.Mutex
	leader string
	cancel context.CancelFunc
	wake   chan struct{}
}

func (e *election) set(name string) {
	e.mu.Lock()
	if e.cancel != nil {
		e.cancel()
	}
	e.leader, e.cancel = name, nil
	close(e.wake)
	e.wake = make(chan struct{})
	e.mu.Unlock()
}

func (e *election) lead(ctx context.Context, name string) (context.Context, error) {
	for {
		e.mu.Lock()
		if e.leader == name && e.cancel == nil {
			lctx, cancel := context.WithCancel(ctx)
			e.cancel = cancel
			e.mu.Unlock()
			return lctx, nil
		}
		wake := e.wake
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

// singleton runs run whenever name leads, as appliance's singleton work.
func singleton(ctx context.Context, wg *sync.WaitGroup, e *election, name string, run func(context.Context) error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			lctx, err := e.lead(ctx, name)
			if err != nil {
				return
			}
			_ = run(lctx)
			<-lctx.Done()
		}
	}()
}

// TestOneLeaderActs: two appliances on one store, each with its
// controller as singleton work. Only the leader's powers machines; when
// the lead passes, the other one carries on.
func TestOneLeaderActs(t *testing.T) {
	r := newRig(t)
	a := r.appliance(5 * time.Millisecond)
	b := r.appliance(5 * time.Millisecond)
	a.create(t, inventoryv1.Machine_READY, "m1", "m2")
	a.apply(t, &inventoryv1.StandbyPool{Name: "ci", MinReady: 1, Readiness: inventoryv1.Readiness_READINESS_BOOTED})
	e := &election{wake: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	singleton(ctx, &wg, e, "a", a.ctrl.Run)
	singleton(ctx, &wg, e, "b", b.ctrl.Run)
	e.set("a")
	waitFor(t, "m1 booting", func() bool {
		m, _ := a.inv.GetMachine(ctx, "m1")
		return m.GetWatchdog().GetArmedAt() != nil
	})
	time.Sleep(50 * time.Millisecond) // several more passes
	if got, want := a.bmc.take(), []string{"m1 pxe", "m1 on"}; !slices.Equal(got, want) {
		t.Errorf("leader a: %v, want %v", got, want)
	}
	if c := b.bmc.take(); len(c) != 0 {
		t.Errorf("b, not leader, acted: %v", c)
	}

	e.set("b")
	allocate(t, a, "m1")
	waitFor(t, "m2 booting", func() bool {
		m, _ := a.inv.GetMachine(ctx, "m2")
		return m.GetWatchdog().GetArmedAt() != nil
	})
	time.Sleep(50 * time.Millisecond)
	cancel()
	wg.Wait()
	if c := a.bmc.take(); len(c) != 0 {
		t.Errorf("a, no longer leader, acted: %v", c)
	}
	if got, want := b.bmc.take(), []string{"m2 pxe", "m2 on"}; !slices.Equal(got, want) {
		t.Errorf("leader b: %v, want %v", got, want)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestApplyValidation: a bad spec is InvalidArgument at the API edge.
func TestApplyValidation(t *testing.T) {
	r := newRig(t)
	srv := &server{s: NewService(r.st, r.clk.Now, nil)}
	ok := func() *inventoryv1.StandbyPool {
		return &inventoryv1.StandbyPool{Name: "ci", MinReady: 1, Readiness: inventoryv1.Readiness_READINESS_BOOTED, Selector: "zone=a"}
	}
	for name, tc := range map[string]struct {
		edit func(p *inventoryv1.StandbyPool)
		want codes.Code
	}{
		"valid":             {func(*inventoryv1.StandbyPool) {}, codes.OK},
		"negative min":      {func(p *inventoryv1.StandbyPool) { p.MinReady = -1 }, codes.InvalidArgument},
		"bad selector":      {func(p *inventoryv1.StandbyPool) { p.Selector = "cpu.cores>>x" }, codes.InvalidArgument},
		"no readiness":      {func(p *inventoryv1.StandbyPool) { p.Readiness = 0 }, codes.InvalidArgument},
		"unknown readiness": {func(p *inventoryv1.StandbyPool) { p.Readiness = 7 }, codes.InvalidArgument},
		"unknown erase":     {func(p *inventoryv1.StandbyPool) { p.Erase = 9 }, codes.InvalidArgument},
		"bad name":          {func(p *inventoryv1.StandbyPool) { p.Name = "a b" }, codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			p := ok()
			tc.edit(p)
			_, err := srv.ApplyStandbyPool(context.Background(), &inventoryv1.ApplyStandbyPoolRequest{Pool: p})
			if got := status.Code(err); got != tc.want {
				t.Errorf("ApplyStandbyPool: %v (%v), want %v", got, err, tc.want)
			}
		})
	}
	if _, err := srv.GetStandbyPool(context.Background(), &inventoryv1.GetStandbyPoolRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetStandbyPool of an unknown pool: %v, want NotFound", err)
	}
}

// TestEraseLevel: the pool's erase level, NONE without a pool or a level.
func TestEraseLevel(t *testing.T) {
	r := newRig(t)
	s := NewService(r.st, r.clk.Now, nil)
	ctx := context.Background()
	for _, p := range []*inventoryv1.StandbyPool{
		{Name: "full", Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL},
		{Name: "plain", Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF},
	} {
		if _, err := s.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for pool, want := range map[string]inventoryv1.EraseLevel{
		"full": inventoryv1.EraseLevel_ERASE_LEVEL_FULL, "plain": inventoryv1.EraseLevel_ERASE_LEVEL_NONE,
		"nope": inventoryv1.EraseLevel_ERASE_LEVEL_NONE, "": inventoryv1.EraseLevel_ERASE_LEVEL_NONE,
	} {
		if got := s.EraseLevel(pool); got != want {
			t.Errorf("EraseLevel(%q) = %v, want %v", pool, got, want)
		}
	}
}

// TestPowerActionsRateLimited: a pass makes at most MaxActions power
// actions; the next pass carries on.
func TestPowerActionsRateLimited(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.ctrl.cfg.MaxActions = 1
	a.create(t, inventoryv1.Machine_READY, "m1", "m2", "m3")
	a.apply(t, &inventoryv1.StandbyPool{Name: "ci", MinReady: 3, Readiness: inventoryv1.Readiness_READINESS_BOOTED})
	for k, want := range [][]string{{"m1 pxe", "m1 on"}, {"m2 pxe", "m2 on"}, {"m3 pxe", "m3 on"}, nil} {
		a.pass(t)
		if got := a.bmc.take(); !slices.Equal(got, want) {
			t.Fatalf("pass %d: %v, want %v", k+1, got, want)
		}
	}
}

// TestPowerPathsRecheck: the lifecycle's standby power paths refuse a
// machine that is no longer READY and free when they claim it (allocated
// since the controller looked), and a machine already booting.
func TestPowerPathsRecheck(t *testing.T) {
	r := newRig(t)
	a := r.appliance(time.Hour)
	a.create(t, inventoryv1.Machine_READY, "m1", "m2")
	allocate(t, a, "m1")
	ctx := context.Background()
	if err := a.ctrl.cfg.Power.StandbyPowerOn(ctx, "m1", "test"); !lifecycle.IsNotStandby(err) {
		t.Errorf("power on an allocated machine: %v, want ErrNotStandby", err)
	}
	if err := a.ctrl.cfg.Power.StandbyPowerOff(ctx, "m1", "test"); !lifecycle.IsNotStandby(err) {
		t.Errorf("power off an allocated machine: %v, want ErrNotStandby", err)
	}
	if err := a.ctrl.cfg.Power.StandbyPowerOn(ctx, "m2", "test"); err != nil {
		t.Fatal(err)
	}
	if err := a.ctrl.cfg.Power.StandbyPowerOn(ctx, "m2", "test"); !lifecycle.IsNotStandby(err) {
		t.Errorf("power on a booting machine: %v, want ErrNotStandby", err)
	}
	if got, want := a.bmc.take(), []string{"m2 pxe", "m2 on"}; !slices.Equal(got, want) {
		t.Errorf("BMC calls %v, want %v", got, want)
	}
}
