package inventory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Commissioning (docs/architecture.md, "Commissioning"): a profile names
// the tests the discovery agent runs; the results are kept in
// Machine.commission; a machine whose commissioning is under way, or
// failed and was not cleared, is held back from accept and allocation.

// CommissionIDPrefix starts every commission id (a Progress's install_id
// says which plan it reports on).
const CommissionIDPrefix = "commission-"

// Commission statuses.
const (
	CommissionPending = "pending"
	CommissionRunning = "running"
	CommissionPassed  = "passed"
	CommissionFailed  = "failed"
)

// Bounds on what an agent reports (its output is the machine's, so an
// attacker's): tests per commissioning, and each field's bytes.
const (
	MaxCommissionTests   = 64
	MaxCommissionOutput  = 4 << 10
	maxCommissionSummary = 256
	maxCommissionTarget  = 64
)

// CommissionProfiles are the profiles by name: quick (minutes on real
// hardware, about a minute under TCG), full (a burn-in) and link-10g
// (quick's tests, and every NIC must link at 10 Gb/s or more, full
// duplex; a machine whose NICs cannot is failed by it, as a QEMU machine
// is: the lab's way to make commissioning fail).
var CommissionProfiles = map[string][]*inventoryv1.CommissionStep{
	"quick": {
		{Kind: "smart"},
		{Kind: "memtester", MemoryMib: 16, Loops: 1},
		{Kind: "stress-ng", Seconds: 10},
		{Kind: "fio", Seconds: 5},
		{Kind: "link"},
	},
	"full": {
		{Kind: "smart", SelfTest: true, Seconds: 130},
		{Kind: "memtester", MemoryMib: 1024, Loops: 2},
		{Kind: "stress-ng", Seconds: 600},
		{Kind: "fio", Seconds: 60},
		{Kind: "link", FullDuplex: true},
	},
	"link-10g": {
		{Kind: "smart"},
		{Kind: "memtester", MemoryMib: 16, Loops: 1},
		{Kind: "stress-ng", Seconds: 10},
		{Kind: "fio", Seconds: 5},
		{Kind: "link", MinLinkMbps: 10000, FullDuplex: true},
	},
}

// CommissionProfileNames are the profiles' names, sorted.
func CommissionProfileNames() []string {
	var n []string
	for k := range CommissionProfiles {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// CommissionHold says why m may not be accepted or allocated because of
// its commissioning, or nil.
func CommissionHold(m *inventoryv1.Machine) error {
	c := m.GetCommission()
	switch {
	case c == nil:
		return nil
	case c.GetStatus() == CommissionPending || c.GetStatus() == CommissionRunning:
		return apierr.Preconditionf("machine %q is being commissioned (%s, profile %s): wait for it to finish", m.GetName(), c.GetStatus(), c.GetProfile())
	case c.GetStatus() == CommissionFailed && !c.GetCleared():
		return apierr.Preconditionf("machine %q failed commissioning (%s): fix it and run `corral machine commission %s` again, or clear it with `corral machine commission clear %s`",
			m.GetName(), c.GetError(), m.GetName(), m.GetName())
	}
	return nil
}

// commissionable states: a machine the discovery agent can run tests on
// and that nobody uses.
var commissionable = []inventoryv1.Machine_MachineState{
	inventoryv1.Machine_DISCOVERED, inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_READY, inventoryv1.Machine_FAILED,
}

// StartCommission makes m's commissioning a new pending one with profile
// ("" is quick), requested by by at now. A machine in use (installing,
// deployed, allocated, releasing), in maintenance or in conflict is
// refused, as is one whose commissioning is under way.
func StartCommission(m *inventoryv1.Machine, profile, by string, now time.Time) error {
	if profile == "" {
		profile = "quick"
	}
	steps, ok := CommissionProfiles[profile]
	if !ok {
		return apierr.Invalidf("commissioning profile %q: want one of %s", profile, strings.Join(CommissionProfileNames(), ", "))
	}
	if !slices.Contains(commissionable, m.GetState()) {
		return apierr.Preconditionf("machine %q is %s: only a discovered, inventoried, ready or failed machine is commissioned", m.GetName(), m.GetState())
	}
	if c := m.GetCommission(); c.GetStatus() == CommissionPending || c.GetStatus() == CommissionRunning {
		return apierr.Preconditionf("machine %q is already being commissioned (%s, profile %s)", m.GetName(), c.GetCommissionId(), c.GetProfile())
	}
	c := &inventoryv1.Commission{CommissionId: CommissionIDPrefix + fmt.Sprintf("%016x", rand.Uint64()), Profile: profile,
		Status: CommissionPending, RequestedAt: timestamppb.New(now), RequestedBy: by}
	for _, s := range steps {
		c.Steps = append(c.Steps, proto.Clone(s).(*inventoryv1.CommissionStep))
	}
	m.Commission = c
	m.UpdatedAt = timestamppb.New(now)
	return nil
}

// CleanCommissionTest bounds and checks one test result an agent sent
// for c: a kind none of c's steps has, or a result other than pass, fail
// or skip, is recorded as a failure saying so; text fields are cut to
// their bounds as valid UTF-8 (they are escaped when printed). It
// returns nil when c holds MaxCommissionTests already.
func CleanCommissionTest(c *inventoryv1.Commission, t *inventoryv1.CommissionTest) *inventoryv1.CommissionTest {
	if len(c.GetTests()) >= MaxCommissionTests {
		return nil
	}
	out := &inventoryv1.CommissionTest{
		Name:       cut(t.GetName(), maxCommissionTarget),
		Target:     cut(t.GetTarget(), maxCommissionTarget),
		Result:     t.GetResult(),
		DurationMs: max(t.GetDurationMs(), 0),
		Summary:    cut(t.GetSummary(), maxCommissionSummary),
		Output:     cut(t.GetOutput(), MaxCommissionOutput),
	}
	known := slices.ContainsFunc(c.GetSteps(), func(s *inventoryv1.CommissionStep) bool { return s.GetKind() == out.Name })
	switch {
	case !known:
		out.Result, out.Summary = "fail", "the agent reported a test the plan does not have"
	case out.Result != "pass" && out.Result != "fail" && out.Result != "skip":
		out.Result, out.Summary = "fail", fmt.Sprintf("the agent reported result %q", cut(out.Result, 16))
	}
	return out
}

// cut bounds s to n bytes of valid UTF-8.
func cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// ClearCommission lets a machine whose commissioning failed be accepted
// and allocated again; its results are kept, marked cleared by by. A
// commissioning still pending or running (its agent never came, or went
// away) is abandoned: failed, "abandoned", and cleared; a report of it
// arriving later is dropped.
func (i *Inventory) ClearCommission(ctx context.Context, name, by string) (*inventoryv1.Machine, error) {
	var was string
	m, err := i.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		c := m.GetCommission()
		if s := c.GetStatus(); s == CommissionPending || s == CommissionRunning {
			c.Status, c.Error = CommissionFailed, "abandoned by "+by+" while "+s
		}
		if c.GetStatus() != CommissionFailed {
			return apierr.Preconditionf("machine %q has no failed commissioning to clear (status %q)", name, cmpOr(c.GetStatus(), "none"))
		}
		if c.GetCleared() {
			return errSkip
		}
		was = c.GetError()
		now := timestamppb.New(i.cfg.Now())
		c.Cleared, c.ClearedAt, c.ClearedBy = true, now, by
		m.UpdatedAt = now
		return nil
	})
	if IsSkip(err) {
		return i.GetMachine(ctx, name)
	}
	if err != nil {
		return nil, err
	}
	i.machineEvent(m, "commission-cleared", "commissioning failure cleared by "+by+": "+was, map[string]string{"install_id": m.GetCommission().GetCommissionId()})
	return m, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// CommissionVerbs is the lifecycle's side of commissioning (the plan to
// the agent). Implemented by *lifecycle.Lifecycle.
type CommissionVerbs interface {
	Commission(ctx context.Context, name, profile, by string) (*inventoryv1.Machine, error)
}

// CommissionServer is corral.inventory.v1 CommissionService.
type CommissionServer struct {
	inventoryv1.UnimplementedCommissionServiceServer
	Inv       *Inventory
	Lifecycle CommissionVerbs
	// Caller says who calls (nil: Anonymous).
	Caller func(ctx context.Context) Owner
}

func (s *CommissionServer) caller(ctx context.Context) Owner {
	if s.Caller == nil {
		return Owner{ID: Anonymous, Operator: true}
	}
	return s.Caller(ctx)
}

// CommissionMachine starts commissioning (CommissionVerbs).
func (s *CommissionServer) CommissionMachine(ctx context.Context, req *inventoryv1.CommissionMachineRequest) (*inventoryv1.Machine, error) {
	if s.Lifecycle == nil {
		return nil, apierr.ToStatus(errNoLifecycle)
	}
	return machineOrStatus(s.Lifecycle.Commission(ctx, req.GetName(), req.GetProfile(), s.caller(ctx).ID))
}

// ClearCommission clears a failed commissioning (Inventory.ClearCommission).
func (s *CommissionServer) ClearCommission(ctx context.Context, req *inventoryv1.ClearCommissionRequest) (*inventoryv1.Machine, error) {
	return machineOrStatus(s.Inv.ClearCommission(ctx, req.GetName(), s.caller(ctx).ID))
}

// RegisterCommission registers srv's CommissionService on s.
func RegisterCommission(s grpc.ServiceRegistrar, srv *CommissionServer) {
	inventoryv1.RegisterCommissionServiceServer(s, srv)
}

// CommissionPending reports whether mac's machine has commissioning
// waiting for, or with, its discovery agent (boot/http.Commissioning: its
// discovery boot carries the commissioning overlay).
func (i *Inventory) CommissionPending(ctx context.Context, mac string) bool {
	m, err := i.MachineByMAC(ctx, mac)
	if err != nil {
		return false
	}
	s := m.GetCommission().GetStatus()
	return s == CommissionPending || s == CommissionRunning
}
