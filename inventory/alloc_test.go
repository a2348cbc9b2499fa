package inventory

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// poolMachine is a READY machine of pool ci in zone a with cores cores and
// disks disks.
func poolMachine(name string, cores, disks int) *inventoryv1.Machine {
	f := &inventoryv1.Facts{Cpu: &inventoryv1.Facts_Cpu{Cores: uint32(cores)}}
	for d := range disks {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{Name: fmt.Sprintf("sd%c", 'a'+d), SizeBytes: 1 << 40})
	}
	return &inventoryv1.Machine{Name: name, State: inventoryv1.Machine_READY, Pool: "ci", Zone: "a", Facts: f,
		Labels: map[string]string{"rack": "r1"}}
}

func create(t *testing.T, inv *Inventory, ms ...*inventoryv1.Machine) {
	t.Helper()
	for _, m := range ms {
		if _, err := inv.CreateMachine(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// raceAllocate: 64 concurrent allocations, each for one machine, of the
// two free machines that match give exactly two, one each; the others
// hear ResourceExhausted.
func raceAllocate(t *testing.T, invs ...*Inventory) {
	ctx := context.Background()
	create(t, invs[0], poolMachine("free-1", 16, 2), poolMachine("free-2", 32, 4),
		poolMachine("small", 4, 2), // matches the pool, not the cores
		&inventoryv1.Machine{Name: "inv", State: inventoryv1.Machine_INVENTORIED, Pool: "ci"})
	const callers = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]string{} // machine → owner
	var exhausted, other []error
	for k := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := Owner{ID: fmt.Sprintf("token:%02d", k)}
			ms, err := invs[k%len(invs)].AllocateMachines(ctx, owner, AllocateRequest{Selector: "pool=ci,zone=a,cpu.cores>=16,disks.count>=2"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				for _, m := range ms {
					if prev, dup := got[m.GetName()]; dup {
						t.Errorf("machine %s allocated twice: to %s and %s", m.GetName(), prev, owner.ID)
					}
					got[m.GetName()] = owner.ID
				}
			case errors.Is(err, apierr.ErrExhausted):
				exhausted = append(exhausted, err)
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if len(got) != 2 || got["free-1"] == "" || got["free-2"] == "" {
		t.Fatalf("allocated %v; want free-1 and free-2", got)
	}
	if len(other) > 0 || len(exhausted) != callers-2 {
		t.Fatalf("%d exhausted, other errors %v", len(exhausted), other)
	}
	if msg := exhausted[0].Error(); !strings.Contains(msg, "0 READY machine(s) match") || !strings.Contains(msg, "2 ALLOCATED") {
		t.Errorf("exhausted message %q", msg)
	}
	for name, owner := range got {
		m, err := invs[0].GetMachine(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if m.GetState() != inventoryv1.Machine_ALLOCATED || m.GetAllocation().GetOwner() != owner {
			t.Errorf("%s: %s owned by %q, want ALLOCATED to %s", name, m.GetState(), m.GetAllocation().GetOwner(), owner)
		}
	}
}

func TestAllocateConcurrentBolt(t *testing.T) {
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	raceAllocate(t, newInv(t, Config{Store: st}))
}

// TestAllocateConcurrentEtcd races the allocations through two appliances
// on a real etcd, each with its own client.
func TestAllocateConcurrentEtcd(t *testing.T) {
	c := etcdtest.New(t, 1)
	var invs []*Inventory
	for range 2 {
		s, err := etcd.Open(context.Background(), etcd.Options{Endpoints: c.Endpoints(), Prefix: "/alloc", RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		invs = append(invs, newInv(t, Config{Store: store.Store(s)}))
	}
	raceAllocate(t, invs...)
}

func TestAllocateCountAndExpiry(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	inv := newInv(t, Config{Now: func() time.Time { return now }})
	ctx := context.Background()
	create(t, inv, poolMachine("a1", 16, 2), poolMachine("a2", 16, 2), poolMachine("a3", 16, 2))
	alice := Owner{ID: "token:alice", Name: "alice"}
	ms, err := inv.AllocateMachines(ctx, alice, AllocateRequest{Pool: "ci", Count: 2, ExpiresIn: time.Hour})
	if err != nil || len(ms) != 2 {
		t.Fatalf("allocate 2: %d, %v", len(ms), err)
	}
	for _, m := range ms {
		a := m.GetAllocation()
		if a.GetOwnerName() != "alice" || !a.GetExpiresAt().AsTime().Equal(now.Add(time.Hour)) || a.GetSelector() != "pool=ci" ||
			a.GetAllocationId() != ms[0].GetAllocation().GetAllocationId() {
			t.Errorf("allocation %v", a)
		}
	}
	// All or none: two more of one free is none.
	if _, err := inv.AllocateMachines(ctx, alice, AllocateRequest{Pool: "ci", Count: 2}); !errors.Is(err, apierr.ErrExhausted) {
		t.Fatalf("allocate 2 of 1: %v", err)
	}
	if m, _ := inv.GetMachine(ctx, "a3"); m.GetState() != inventoryv1.Machine_READY && ms[0].GetName() != "a3" && ms[1].GetName() != "a3" {
		t.Fatalf("the refused allocation took %s", m.GetName())
	}
	if _, err := inv.AllocateMachines(ctx, alice, AllocateRequest{Selector: "pool=gpu"}); !errors.Is(err, apierr.ErrExhausted) ||
		!strings.Contains(err.Error(), `match selector "pool=gpu"`) {
		t.Fatalf("no match: %v", err)
	}
	for name, r := range map[string]AllocateRequest{
		"negative expiry": {ExpiresIn: -time.Minute},
		"long expiry":     {ExpiresIn: 400 * 24 * time.Hour},
		"tiny expiry":     {ExpiresIn: time.Millisecond},
		"count":           {Count: 65},
		"selector":        {Selector: "cores>=16"},
		"label op":        {Selector: "label.rack>=1"},
		"pool":            {Pool: "c i"},
	} {
		if _, err := inv.AllocateMachines(ctx, alice, r); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestRelease(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	create(t, inv, poolMachine("r1", 16, 2))
	alice, bob, op := Owner{ID: "token:alice"}, Owner{ID: "token:bob"}, Owner{ID: "token:op", Operator: true}
	if _, err := inv.AllocateMachines(ctx, alice, AllocateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.ReleaseMachine(ctx, bob, "r1", ReleaseOptions{}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("bob releases alice's: %v", err)
	}
	if err := inv.DeleteMachine(ctx, "r1"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("delete an allocated machine: %v", err)
	}
	m, err := inv.ReleaseMachine(ctx, alice, "r1", ReleaseOptions{})
	if err != nil || m.GetState() != inventoryv1.Machine_READY || m.GetAllocation().GetReleaseReason() != "released by its owner" ||
		m.GetAllocation().GetReleasedBy() != "token:alice" {
		t.Fatalf("release: %v %v", m, err)
	}
	// Released: alice hears why; bob is still refused.
	if _, err := inv.ReleaseMachine(ctx, alice, "r1", ReleaseOptions{}); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "released by its owner") {
		t.Fatalf("release twice: %v", err)
	}
	if _, err := inv.ReleaseMachine(ctx, bob, "r1", ReleaseOptions{}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("bob releases a free machine: %v", err)
	}
	// An operator releases anyone's; an expiry only the allocation it names.
	if _, err := inv.AllocateMachines(ctx, bob, AllocateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.ReleaseMachine(ctx, op, "r1", ReleaseOptions{AllocationID: "older", Expired: true}); !IsSkip(err) {
		t.Fatalf("expiry of another allocation: %v", err)
	}
	m, err = inv.ReleaseMachine(ctx, op, "r1", ReleaseOptions{})
	if err != nil || m.GetAllocation().GetReleaseReason() != "released by an operator" {
		t.Fatalf("operator release: %v %v", m, err)
	}
}

func TestSelectorsLabelsZonePool(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	b := poolMachine("b", 8, 1)
	b.Zone, b.Labels = "b", nil
	create(t, inv, poolMachine("a", 16, 2), b)
	for sel, want := range map[string]string{
		"pool=ci,zone=a,cpu.cores>=16,disks.count>=2": "a",
		"pool=CI":                      "a,b",
		"zone!=a":                      "b",
		"label.rack=r1":                "a",
		"labels.rack=":                 "b",
		"label.rack!=r1, nics.count=0": "b",
		"pool=ci,":                     "a,b",
	} {
		ms, err := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Selectors: []string{sel}})
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		if got := strings.Join(names(ms), ","); got != want {
			t.Errorf("%s: %s, want %s", sel, got, want)
		}
	}
	for _, bad := range []string{"label.Bad Key=1", "label.rack<3", "rack=r1", strings.Repeat("a,", 70), "zone>a"} {
		if _, err := ParseSelectors([]string{bad}); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%.30q: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestLabelMachine(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	create(t, inv, &inventoryv1.Machine{Name: "l1", BootMac: "52:54:00:00:09:01", Labels: map[string]string{"old": "x"}})
	m, err := inv.LabelMachine(ctx, "l1", LabelChange{Set: map[string]string{"zone": "a", "pool": "ci", "example.com/team": "db", "empty": ""}, Remove: []string{"old"}})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetZone() != "a" || m.GetPool() != "ci" || len(m.GetLabels()) != 2 || m.GetLabels()["example.com/team"] != "db" {
		t.Fatalf("labelled: zone %q pool %q labels %v", m.GetZone(), m.GetPool(), m.GetLabels())
	}
	if m, err = inv.LabelMachine(ctx, "l1", LabelChange{Remove: []string{"zone", "missing"}}); err != nil || m.GetZone() != "" || m.GetPool() != "ci" {
		t.Fatalf("remove zone: %v %v", m, err)
	}
	many := map[string]string{}
	for k := range MaxLabels + 1 {
		many[fmt.Sprintf("k%d", k)] = "v"
	}
	for name, c := range map[string]LabelChange{
		"nothing":        {},
		"bad key":        {Set: map[string]string{"a b": "1"}},
		"long key":       {Set: map[string]string{strings.Repeat("k", 64): "1"}},
		"bad prefix":     {Set: map[string]string{"Example.com/x": "1"}},
		"bad value":      {Set: map[string]string{"k": "a,b"}},
		"long value":     {Set: map[string]string{"k": strings.Repeat("v", 64)}},
		"control":        {Set: map[string]string{"k": "a\x1b[2J"}},
		"empty pool":     {Set: map[string]string{"pool": ""}},
		"set and remove": {Set: map[string]string{"k": "v"}, Remove: []string{"k"}},
		"bad remove":     {Remove: []string{"-"}},
		"too many":       {Set: many},
	} {
		if _, err := inv.LabelMachine(ctx, "l1", c); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := inv.LabelMachine(ctx, "nope", LabelChange{Set: map[string]string{"k": "v"}}); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("unknown machine: %v", err)
	}
}

// TestOwnersSee: a caller that is not an operator sees every machine
// nobody else holds, never another caller's; the owner filter lists one
// owner's.
func TestOwnersSee(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	create(t, inv, poolMachine("s1", 16, 2), poolMachine("s2", 16, 2), poolMachine("s3", 16, 2))
	alice, bob := Owner{ID: "token:alice"}, Owner{ID: "token:bob"}
	who := alice
	srv := &MachineServer{Inv: inv, Caller: func(context.Context) Owner { return who }}
	a, err := srv.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Selector: "pool=ci"})
	if err != nil {
		t.Fatal(err)
	}
	mine := a.GetMachines()[0].GetName()
	who = bob
	resp, err := srv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
	if err != nil || len(resp.GetMachines()) != 2 {
		t.Fatalf("bob lists %d, %v; want the 2 free", len(resp.GetMachines()), err)
	}
	if _, err := srv.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: mine}); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("bob gets alice's machine: %v", err)
	}
	if _, err := srv.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: mine}); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("bob releases alice's machine: %v", err)
	}
	who = alice
	resp, err = srv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Owner: "me"})
	if err != nil || len(resp.GetMachines()) != 1 || resp.GetMachines()[0].GetName() != mine {
		t.Fatalf("alice's own: %v, %v", resp.GetMachines(), err)
	}
	who = Owner{ID: "token:op", Operator: true}
	resp, err = srv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Owner: "token:alice"})
	if err != nil || len(resp.GetMachines()) != 1 {
		t.Fatalf("operator lists alice's: %v, %v", resp.GetMachines(), err)
	}
}

// TestAllocateWarmFirst: an allocation takes a machine booted and waiting
// (Config.Warm: a booted standby pool's) before a cold one.
func TestAllocateWarmFirst(t *testing.T) {
	for range 20 {
		inv := newInv(t, Config{Warm: func(name string) bool { return name == "w1" || name == "w2" }})
		ctx := context.Background()
		for _, n := range []string{"c1", "c2", "w1", "c3", "w2", "c4"} {
			create(t, inv, poolMachine(n, 16, 2))
		}
		ms, err := inv.AllocateMachines(ctx, Owner{ID: "token:alice"}, AllocateRequest{Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.GetName())
		}
		slices.Sort(got)
		if !slices.Equal(got, []string{"w1", "w2"}) {
			t.Fatalf("allocated %v, want the warm w1 and w2", got)
		}
		// With the warm ones taken, cold ones are still allocated.
		if ms, err := inv.AllocateMachines(ctx, Owner{ID: "token:bob"}, AllocateRequest{}); err != nil || strings.HasPrefix(ms[0].GetName(), "w") {
			t.Fatalf("then: %v %v", ms, err)
		}
	}
}
