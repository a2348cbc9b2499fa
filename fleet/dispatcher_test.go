package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func appliance(name, endpoint string, bmc, boot []string) *fleetv1.Appliance {
	return &fleetv1.Appliance{Name: name, ApiEndpoint: endpoint, BmcNetworks: bmc, BootSegments: boot}
}

// rig is a dispatcher on an in-memory store with a settable clock; pass
// runs one dispatch pass over what the store holds now.
type rig struct {
	st  *mem.Store
	inv *inventory.Inventory
	clk *fakeclock.Clock
	d   *Dispatcher
	s   *dispatch
}

func newRig(t *testing.T) *rig {
	t.Helper()
	st := mem.New()
	t.Cleanup(func() { st.Close() })
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{st: st, inv: inv, clk: fakeclock.New(t0)}
	r.d = &Dispatcher{Store: st, Self: "lead", Now: r.clk.Now}
	if err := r.d.fill(); err != nil {
		t.Fatal(err)
	}
	r.s = r.d.newDispatch()
	return r
}

// load reads the three prefixes into the mirrors, as their follow would.
func (r *rig) load(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, load := range []func(context.Context) (int64, error){r.s.runners.load, r.s.machines.load, r.s.assigns.load} {
		if _, err := load(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func (r *rig) pass(t *testing.T) {
	t.Helper()
	r.load(t)
	r.s.pass(context.Background())
}

// beat writes a runner record whose last heartbeat was age ago.
func (r *rig) beat(t *testing.T, a *fleetv1.Appliance, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	key := AppliancePrefix + a.GetName()
	var rev int64
	if kv, err := r.st.Get(ctx, key); err == nil {
		rev = kv.Revision
	}
	a.StartedAt = timestamppb.New(t0.Add(-time.Hour))
	a.LastHeartbeat = timestamppb.New(r.clk.Now().Add(-age))
	if _, err := record.Put(ctx, r.st, key, a, rev); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) machine(t *testing.T, name, bmc, mac string) {
	t.Helper()
	m := &inventoryv1.Machine{Name: name}
	if bmc != "" {
		m.Bmc = &inventoryv1.Bmc{Address: bmc}
	}
	if mac != "" {
		m.BootMac, m.Macs = mac, []string{mac}
	}
	if _, err := r.inv.CreateMachine(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// assigned returns machine -> "runner: reason".
func (r *rig) assigned(t *testing.T) map[string]string {
	t.Helper()
	as, err := record.List(context.Background(), r.st, AssignmentPrefix, func() *fleetv1.Assignment { return &fleetv1.Assignment{} })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range as {
		if a.GetLeader() != "lead" {
			t.Errorf("assignment of %s written by leader %q", a.GetMachine(), a.GetLeader())
		}
		out[a.GetMachine()] = a.GetRunner() + ": " + a.GetReason()
	}
	return out
}

func (r *rig) revisions(t *testing.T) map[string]int64 {
	t.Helper()
	kvs, err := r.st.List(context.Background(), AssignmentPrefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range kvs {
		out[kv.Key] = kv.Revision
	}
	return out
}

func TestPrefixesAreTheOwners(t *testing.T) {
	if LeasePrefix != dhcp.LeasePrefix {
		t.Errorf("LeasePrefix %q, boot/dhcp keeps leases under %q", LeasePrefix, dhcp.LeasePrefix)
	}
	// MachinePrefix: inventory's CreateMachine must land where the
	// dispatcher looks.
	r := newRig(t)
	r.machine(t, "m1", "", "")
	if _, err := r.st.Get(context.Background(), MachinePrefix+"m1"); err != nil {
		t.Errorf("inventory's machine is not under %s: %v", MachinePrefix, err)
	}
}

func TestDispatchRules(t *testing.T) {
	expiredAt := t0.Add(-time.Second).Add(DefaultExpiry).Format(time.RFC3339) // a beat at t0-1s
	tests := map[string]struct {
		setup func(t *testing.T, r *rig)
		want  map[string]string
		// redo is the runners whose machines were re-dispatched, with
		// whether they left.
		redo map[string]bool
	}{
		"least loaded, ties by name": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Second)
				r.beat(t, appliance("b", "", nil, nil), time.Second)
				for i := range 3 {
					r.machine(t, fmt.Sprintf("m%d", i), "", "")
				}
			},
			want: map[string]string{"m0": "a: least loaded of 2", "m1": "b: least loaded of 2", "m2": "a: least loaded of 2"},
		},
		"bmc affinity": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", []string{"10.0.0.0/24"}, nil), time.Second)
				r.beat(t, appliance("b", "", []string{"10.0.1.0/24"}, nil), time.Second)
				r.machine(t, "m0", "10.0.1.5", "")
				r.machine(t, "m1", "10.0.1.6", "")
				r.machine(t, "m2", "bmc-7.example", "")
			},
			want: map[string]string{
				"m0": "b: affinity: bmc network 10.0.1.0/24",
				"m1": "b: affinity: bmc network 10.0.1.0/24",
				"m2": "a: least loaded of 2",
			},
		},
		"boot segment from the last DHCP lease": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
				r.beat(t, appliance("b", "", nil, []string{"192.168.1.0/24"}), time.Second)
				r.machine(t, "m0", "", "aa:bb:cc:00:00:01")
				r.machine(t, "m1", "", "aa:bb:cc:00:00:02")
				for ip, l := range map[string]*bootv1.Lease{
					"192.168.0.9":  {Ip: "192.168.0.9", Mac: "aa:bb:cc:00:00:01", UpdatedUnix: 10},
					"192.168.1.9":  {Ip: "192.168.1.9", Mac: "aa:bb:cc:00:00:01", UpdatedUnix: 20}, // newer: wins
					"192.168.0.10": {Ip: "192.168.0.10", Mac: "aa:bb:cc:00:00:02", UpdatedUnix: 5},
				} {
					if _, err := record.Put(context.Background(), r.st, LeasePrefix+ip, l, 0); err != nil {
						t.Fatal(err)
					}
				}
			},
			want: map[string]string{
				"m0": "b: affinity: boot segment 192.168.1.0/24",
				"m1": "a: affinity: boot segment 192.168.0.0/24",
			},
		},
		"expired runner's machines re-dispatched, live ones stay": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Second)
				r.beat(t, appliance("b", "", nil, nil), time.Second)
				r.machine(t, "m0", "", "")
				r.machine(t, "m1", "", "")
				r.pass(t) // m0 -> a, m1 -> b
				r.clk.Advance(40 * time.Second)
				r.beat(t, appliance("b", "", nil, nil), time.Second)
			},
			want: map[string]string{
				"m0": "b: runner a expired at " + expiredAt + ": re-dispatched; least loaded of 1",
				"m1": "b: least loaded of 2",
			},
			redo: map[string]bool{"a": false},
		},
		"graceful leave": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Second)
				r.beat(t, appliance("b", "", nil, nil), time.Second)
				r.machine(t, "m0", "", "")
				r.pass(t) // m0 -> a
				if err := r.st.Delete(context.Background(), AppliancePrefix+"a", mustRev(t, r.st, AppliancePrefix+"a")); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"m0": "b: runner a left: re-dispatched; least loaded of 1"},
			redo: map[string]bool{"a": true},
		},
		"deleted machine's assignment removed": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Second)
				r.machine(t, "m0", "", "")
				r.machine(t, "m1", "", "")
				r.pass(t)
				if err := r.inv.DeleteMachine(context.Background(), "m0"); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"m1": "a: least loaded of 1"},
		},
		"no live runner: nothing written": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Minute)
				r.machine(t, "m0", "", "")
			},
			want: map[string]string{},
		},
		"a runner whose networks exclude its machine loses it": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", []string{"10.0.0.0/24"}, nil), time.Second)
				r.machine(t, "m0", "", "")
				r.pass(t) // m0 -> a (no BMC address yet)
				r.beat(t, appliance("b", "", []string{"10.0.9.0/24"}, nil), time.Second)
				if _, err := r.inv.UpdateMachine(context.Background(), "m0", func(m *inventoryv1.Machine) error {
					m.Bmc = &inventoryv1.Bmc{Address: "10.0.9.9"}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"m0": "b: runner a's networks do not contain bmc 10.0.9.9: moved; affinity: bmc network 10.0.9.0/24"},
		},
		"undecodable assignment replaced": {
			setup: func(t *testing.T, r *rig) {
				r.beat(t, appliance("a", "", nil, nil), time.Second)
				r.machine(t, "m0", "", "")
				if _, err := r.st.Put(context.Background(), AssignmentPrefix+"m0", []byte("garbage"), 0); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"m0": "a: least loaded of 1"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			tt.setup(t, r)
			r.pass(t)
			if diff := cmp.Diff(tt.want, r.assigned(t)); diff != "" {
				t.Errorf("assignments (-want +got):\n%s", diff)
			}
			redo := map[string]bool{}
			for _, rd := range r.d.Redispatches() {
				redo[rd.Runner] = rd.Left
			}
			if diff := cmp.Diff(tt.redo, redo, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("re-dispatches (-want +got):\n%s", diff)
			}
		})
	}
}

func mustRev(t *testing.T, st store.Store, key string) int64 {
	t.Helper()
	kv, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return kv.Revision
}

// TestDispatchStable: a pass over live runners rewrites nothing, even when
// a new, idle runner joins (no churn).
func TestDispatchStable(t *testing.T) {
	r := newRig(t)
	r.beat(t, appliance("a", "", nil, nil), time.Second)
	for i := range 4 {
		r.machine(t, fmt.Sprintf("m%d", i), "", "")
	}
	r.pass(t)
	before := r.revisions(t)
	if len(before) != 4 {
		t.Fatalf("%d assignments, want 4", len(before))
	}
	r.beat(t, appliance("b", "", nil, nil), 0)
	r.clk.Advance(5 * time.Second)
	r.beat(t, appliance("a", "", nil, nil), 0)
	for range 3 {
		r.pass(t)
	}
	if diff := cmp.Diff(before, r.revisions(t)); diff != "" {
		t.Errorf("assignments rewritten (-before +after):\n%s", diff)
	}
	r.machine(t, "m9", "", "")
	r.pass(t)
	if got := r.assigned(t)["m9"]; got != "b: least loaded of 2" {
		t.Errorf("new machine: %q, want the idle runner b", got)
	}
}

// TestRedispatchReported: the time from a runner's last heartbeat to the
// re-dispatch of its machines is logged and readable.
func TestRedispatchReported(t *testing.T) {
	r := newRig(t)
	r.beat(t, appliance("a", "", nil, nil), 0)
	r.beat(t, appliance("b", "", nil, nil), 0)
	for i := range 4 {
		r.machine(t, fmt.Sprintf("m%d", i), "", "")
	}
	r.pass(t)
	r.clk.Advance(31 * time.Second)
	r.beat(t, appliance("b", "", nil, nil), 0)
	r.pass(t)
	want := []Redispatch{{Runner: "a", Machines: 2, LastHeartbeat: t0, At: t0.Add(31 * time.Second), After: 31 * time.Second}}
	if diff := cmp.Diff(want, r.d.Redispatches()); diff != "" {
		t.Errorf("Redispatches (-want +got):\n%s", diff)
	}
	for m, a := range r.assigned(t) {
		if !strings.HasPrefix(a, "b: ") {
			t.Errorf("%s: %s, want runner b", m, a)
		}
	}
}

// TestDispatcherRunReactsToWatch runs the real loop: a machine created
// after the dispatcher started is assigned within a second (the Interval
// is an hour, so only the watch can wake it), and so is the re-dispatch
// of a runner that leaves.
func TestDispatcherRunReactsToWatch(t *testing.T) {
	st := mem.New()
	defer st.Close()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, a := range []*fleetv1.Appliance{appliance("a", "", nil, nil), appliance("b", "", nil, nil)} {
		a.LastHeartbeat = timestamppb.Now()
		if _, err := record.Put(ctx, st, AppliancePrefix+a.GetName(), a, 0); err != nil {
			t.Fatal(err)
		}
	}
	d := &Dispatcher{Store: st, Self: "lead", Interval: time.Hour, Expiry: time.Hour}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "m0"}); err != nil {
		t.Fatal(err)
	}
	a := waitAssigned(t, st, "m0", "", time.Second)
	t.Logf("new machine assigned to %s after %s", a.GetRunner(), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := st.Delete(ctx, AppliancePrefix+a.GetRunner(), mustRev(t, st, AppliancePrefix+a.GetRunner())); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"a": "b", "b": "a"}[a.GetRunner()]
	waitAssigned(t, st, "m0", other, time.Second)
	t.Logf("left runner's machine re-dispatched after %s", time.Since(start).Round(time.Millisecond))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// waitAssigned waits until machine's assignment names runner (any runner
// when ""), and returns it.
func waitAssigned(t *testing.T, st store.Store, machine, runner string, within time.Duration) *fleetv1.Assignment {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		a := &fleetv1.Assignment{}
		_, err := record.Get(context.Background(), st, AssignmentPrefix+machine, a)
		if err == nil && (runner == "" || a.GetRunner() == runner) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s machine %s is assigned to %q (err %v), want %q", within, machine, a.GetRunner(), err, runner)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
