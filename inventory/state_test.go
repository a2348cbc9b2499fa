package inventory

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestTransitionTable enumerates every state × every event: the state
// machine of docs/architecture.md. A row lists the states an event
// leaves (to the given state; "=" keeps the state); every state not
// listed refuses the event with ErrInvalidTransition and m unchanged.
func TestTransitionTable(t *testing.T) {
	const (
		U = inventoryv1.Machine_UNSPECIFIED
		D = inventoryv1.Machine_DISCOVERED
		I = inventoryv1.Machine_INVENTORIED
		N = inventoryv1.Machine_INSTALLING // iNstalling
		P = inventoryv1.Machine_DEPLOYED
		F = inventoryv1.Machine_FAILED
		M = inventoryv1.Machine_MAINTENANCE
		C = inventoryv1.Machine_CONFLICT
		R = inventoryv1.Machine_READY
		A = inventoryv1.Machine_ALLOCATED
		X = inventoryv1.Machine_DEPLOYING // eXporting an OS
		L = inventoryv1.Machine_RELEASING // reLeasing
	)
	type S = inventoryv1.Machine_MachineState
	all := []S{U, D, I, N, P, F, M, C, R, A, X, L}
	// to[from]; absent: refused.
	table := map[Event]map[S]S{
		EventCreated:                {U: D, D: D, I: I, N: N, P: P, F: F, M: M, C: C, R: R, A: A, X: X, L: L},
		EventRegistered:             {U: I, D: I, I: I, N: N, P: P, F: F, M: M, R: R, A: A, X: X, L: L},
		EventAccepted:               {I: N, F: N, R: N},
		EventInstallFailed:          {N: F},
		EventNodeReady:              {N: P},
		EventNodeReadyAfterWatchdog: {F: P},
		EventWatchdogExpired:        {U: F, D: F, I: F, N: F, P: F, F: F, R: F, A: F, X: F, L: F},
		EventReprovisioned:          {U: D, D: D, I: D, N: D, P: D, F: D, R: D},
		EventWipeFailed:             {U: F, D: F, I: F, N: F, P: F, F: F, R: F, A: F, X: F, L: F},
		EventMaintenanceOn:          {U: M, D: M, I: M, N: M, P: M, F: M, M: M, R: M, A: M, X: M, L: M},
		// The remembered state comes back (see TestTransitionMaintenance
		// for none remembered).
		EventMaintenanceOff: {M: P},
		EventParked:         {U: C, C: C},
		EventAdopted:        {C: I},
		EventPooled:         {I: R, F: R, R: R},
		EventAllocated:      {R: A},
		EventReleased:       {A: R},
		EventDeploying:      {A: X},
		EventDeployFailed:   {X: F},
		EventDeployBooted:   {X: P},
		EventReleasing:      {A: L},
		EventErased:         {L: R},
		EventEraseFailed:    {L: F},
	}
	if len(table) != int(lastEvent) {
		t.Fatalf("the table has %d events, the package %d", len(table), lastEvent)
	}
	if len(all) != len(inventoryv1.Machine_MachineState_name) {
		t.Fatalf("the table has %d states, the API %d", len(all), len(inventoryv1.Machine_MachineState_name))
	}
	for ev := EventCreated; ev <= lastEvent; ev++ {
		for _, from := range all {
			t.Run(fmt.Sprintf("%s/%s", ev, from), func(t *testing.T) {
				m := &inventoryv1.Machine{Name: "m1", State: from, StateReason: "before",
					MaintenancePreviousState: P, MaintenancePreviousReason: "was deployed"}
				if from == M {
					m.StateReason = "held"
				}
				before := proto.CloneOf(m)
				err := Transition(m, ev)
				want, ok := table[ev][from]
				if !ok {
					if !errors.Is(err, ErrInvalidTransition) || !errors.Is(err, apierr.ErrPrecondition) {
						t.Fatalf("%s from %s: err %v, want ErrInvalidTransition", ev, from, err)
					}
					if diff := cmp.Diff(before, m, protocmp.Transform()); diff != "" {
						t.Fatalf("refused transition changed m (-before +after):\n%s", diff)
					}
					return
				}
				if err != nil || m.GetState() != want {
					t.Fatalf("%s from %s: %s, %v; want %s", ev, from, m.GetState(), err, want)
				}
			})
		}
	}
	if err := Transition(&inventoryv1.Machine{}, Event(99)); !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("unknown event: %v", err)
	}
}

// TestTransitionMaintenance: maintenance remembers the state and reason it
// interrupted and restores them; with nothing remembered a machine with
// facts is INVENTORIED, one without DISCOVERED.
func TestTransitionMaintenance(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_FAILED, StateReason: "install timeout"}
	if err := Transition(m, EventMaintenanceOn); err != nil {
		t.Fatal(err)
	}
	m.StateReason = "disk swap"
	if err := Transition(m, EventMaintenanceOn); err != nil { // again: remembers the first
		t.Fatal(err)
	}
	if m.GetMaintenancePreviousState() != inventoryv1.Machine_FAILED || m.GetMaintenancePreviousReason() != "install timeout" {
		t.Fatalf("remembered %s %q", m.GetMaintenancePreviousState(), m.GetMaintenancePreviousReason())
	}
	if err := Transition(m, EventMaintenanceOff); err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_FAILED || m.GetStateReason() != "install timeout" ||
		m.GetMaintenancePreviousState() != inventoryv1.Machine_UNSPECIFIED || m.GetMaintenancePreviousReason() != "" {
		t.Fatalf("restored %s %q (remembered %s %q)", m.GetState(), m.GetStateReason(), m.GetMaintenancePreviousState(), m.GetMaintenancePreviousReason())
	}
	for name, tc := range map[string]struct {
		m    *inventoryv1.Machine
		want inventoryv1.Machine_MachineState
	}{
		"nothing remembered, no facts": {&inventoryv1.Machine{}, inventoryv1.Machine_DISCOVERED},
		"nothing remembered, facts":    {&inventoryv1.Machine{Facts: &inventoryv1.Facts{}}, inventoryv1.Machine_INVENTORIED},
		"maintenance remembered":       {&inventoryv1.Machine{MaintenancePreviousState: inventoryv1.Machine_MAINTENANCE}, inventoryv1.Machine_DISCOVERED},
	} {
		tc.m.State = inventoryv1.Machine_MAINTENANCE
		if err := Transition(tc.m, EventMaintenanceOff); err != nil || tc.m.GetState() != tc.want {
			t.Errorf("%s: %s %v, want %s", name, tc.m.GetState(), err, tc.want)
		}
	}
}

// TestTransitionMessages: the refusals an operator sees name the machine
// and the way out.
func TestTransitionMessages(t *testing.T) {
	for name, tc := range map[string]struct {
		state inventoryv1.Machine_MachineState
		ev    Event
		want  string
	}{
		"accept deployed":      {inventoryv1.Machine_DEPLOYED, EventAccepted, `machine "m1" is DEPLOYED: already deployed: reprovision it first`},
		"accept maintenance":   {inventoryv1.Machine_MAINTENANCE, EventAccepted, `machine "m1" is in MAINTENANCE: take it out (corral machine maintenance off m1) first`},
		"accept discovered":    {inventoryv1.Machine_DISCOVERED, EventAccepted, `machine "m1" is DISCOVERED: it has reported no facts yet; network-boot it into discovery first`},
		"maintenance off":      {inventoryv1.Machine_INVENTORIED, EventMaintenanceOff, `machine "m1" is INVENTORIED, not in MAINTENANCE`},
		"reprovision in hold":  {inventoryv1.Machine_MAINTENANCE, EventReprovisioned, `machine "m1" is in MAINTENANCE`},
		"reprovision held":     {inventoryv1.Machine_ALLOCATED, EventReprovisioned, `machine "m1" is ALLOCATED: release it first (corral machine release m1)`},
		"accept held":          {inventoryv1.Machine_ALLOCATED, EventAccepted, `machine "m1" is ALLOCATED: release it first (corral machine release m1)`},
		"allocate inventoried": {inventoryv1.Machine_INVENTORIED, EventAllocated, `machine "m1" is INVENTORIED, not READY: it cannot be allocated`},
		"release ready":        {inventoryv1.Machine_READY, EventReleased, `machine "m1" is READY, not allocated: nothing to release`},
		"release releasing":    {inventoryv1.Machine_RELEASING, EventReleased, `machine "m1" is RELEASING: its disks are being erased`},
		"deploy ready":         {inventoryv1.Machine_READY, EventDeploying, `machine "m1" is READY, not allocated: allocate it first (corral machine allocate)`},
		"deploy deploying":     {inventoryv1.Machine_DEPLOYING, EventDeploying, `machine "m1" is DEPLOYING already: wait for it, or release it`},
		"accept deploying":     {inventoryv1.Machine_DEPLOYING, EventAccepted, `machine "m1" is DEPLOYING: release it first (corral machine release m1)`},
	} {
		err := Transition(&inventoryv1.Machine{Name: "m1", State: tc.state}, tc.ev)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	// Every event has a name.
	for ev := EventCreated; ev <= lastEvent; ev++ {
		if strings.HasPrefix(ev.String(), "event(") {
			t.Errorf("event %d has no name", int(ev))
		}
	}
}

// TestTransitionOwners: with an open allocation, a deployed, deploying or
// failed machine is its owner's: it deploys again and releases, and is
// neither accepted, pooled nor reprovisioned; a hypervisor node in the
// same state is not released. A failed erase is retried by releasing
// again and keeps the machine out of the pool until it succeeds.
func TestTransitionOwners(t *testing.T) {
	held := func(s inventoryv1.Machine_MachineState) *inventoryv1.Machine {
		return &inventoryv1.Machine{Name: "m1", State: s, Allocation: &inventoryv1.Allocation{Owner: "token:a"}}
	}
	node := func(s inventoryv1.Machine_MachineState) *inventoryv1.Machine {
		return &inventoryv1.Machine{Name: "m1", State: s}
	}
	for _, tc := range []struct {
		m    *inventoryv1.Machine
		ev   Event
		want inventoryv1.Machine_MachineState // UNSPECIFIED: refused
	}{
		{held(inventoryv1.Machine_DEPLOYED), EventDeploying, inventoryv1.Machine_DEPLOYING},
		{held(inventoryv1.Machine_FAILED), EventDeploying, inventoryv1.Machine_DEPLOYING},
		{held(inventoryv1.Machine_DEPLOYED), EventReleased, inventoryv1.Machine_READY},
		{held(inventoryv1.Machine_DEPLOYING), EventReleasing, inventoryv1.Machine_RELEASING},
		{held(inventoryv1.Machine_FAILED), EventReleasing, inventoryv1.Machine_RELEASING},
		{held(inventoryv1.Machine_FAILED), EventAccepted, 0},
		{held(inventoryv1.Machine_FAILED), EventPooled, 0},
		{held(inventoryv1.Machine_DEPLOYED), EventReprovisioned, 0},
		{held(inventoryv1.Machine_DEPLOYED), EventAccepted, 0},
		{node(inventoryv1.Machine_DEPLOYED), EventReleased, 0},
		{node(inventoryv1.Machine_DEPLOYED), EventDeploying, 0},
		{node(inventoryv1.Machine_FAILED), EventReleasing, 0},
		{&inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_FAILED, Erase: &inventoryv1.Erase{Error: "read back non-zero"}}, EventReleasing, inventoryv1.Machine_RELEASING},
		{&inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_FAILED, Erase: &inventoryv1.Erase{Error: "read back non-zero"}}, EventPooled, 0},
		{&inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_RELEASING, Erase: &inventoryv1.Erase{}}, EventReleasing, inventoryv1.Machine_RELEASING},
	} {
		before := proto.CloneOf(tc.m)
		err := Transition(tc.m, tc.ev)
		if tc.want == 0 {
			if !errors.Is(err, ErrInvalidTransition) || !proto.Equal(before, tc.m) {
				t.Errorf("%s from %s (allocated %t): %v, want refused and unchanged", tc.ev, before.GetState(), before.GetAllocation() != nil, err)
			}
			continue
		}
		if err != nil || tc.m.GetState() != tc.want {
			t.Errorf("%s from %s (allocated %t): %s %v, want %s", tc.ev, before.GetState(), before.GetAllocation() != nil, tc.m.GetState(), err, tc.want)
		}
	}
}
