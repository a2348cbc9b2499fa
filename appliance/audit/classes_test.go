package audit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// callAs runs one unary call through the audit and auth interceptors with
// token ("" = none); the handler returns err.
func (ta *testAudit) callAs(token, method string, req any, err error) {
	unary, _ := ta.Interceptors()
	ctx := context.Background()
	if token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	unary(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		return ta.ic.Unary()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return nil, err })
	})
}

// TestAuditPurgeKeepsOperators: the boot LAN's records are capped apart
// (MaxAgentEvents): a flood of agent calls after the operators' records
// is purged down to its own cap and never takes an operator's record.
func TestAuditPurgeKeepsOperators(t *testing.T) {
	st := mem.New()
	a := newTestAudit(t, st, Config{MaxEvents: 5, MaxAgentEvents: 20, MaxAge: time.Hour})
	a.run(t)
	agent, err := a.ic.Tokens.Create(context.Background(), authv1.Role_ROLE_AGENT, "agent", 0)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		a.set(t0.Add(time.Duration(i) * time.Second))
		a.call("/corral.pool.v1.NodeService/DeleteNode", &poolv1.DeleteNodeRequest{Name: fmt.Sprintf("ops-%d", i)}, nil)
	}
	const flood = 500
	for i := range flood {
		a.set(t0.Add(time.Minute + time.Duration(i)*time.Millisecond))
		a.callAs(agent, "/corral.node.v1.AgentService/Register", &nodev1.RegisterRequest{BootMac: fmt.Sprintf("52:54:00:00:%02x:%02x", i/256, i%256)}, nil)
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	n, err := a.purge(context.Background())
	if err != nil || n != flood-20 {
		t.Fatalf("purge: %d, %v; want %d deleted (the agents' past their cap)", n, err, flood-20)
	}
	evs, err := record.List(context.Background(), st, auditPrefix, func() *auditv1.AuditEvent { return &auditv1.AuditEvent{} })
	if err != nil {
		t.Fatal(err)
	}
	var ops, agents int
	for _, e := range evs {
		switch {
		case strings.HasPrefix(e.GetObject(), "node/ops-") && !strings.HasSuffix(e.GetId(), agentIDSuffix):
			ops++
		case e.GetRole() == authv1.Role_ROLE_AGENT && strings.HasSuffix(e.GetId(), agentIDSuffix):
			agents++
		default:
			t.Errorf("unexpected event %v", e)
		}
	}
	if ops != 3 || agents != 20 {
		t.Errorf("kept %d operator and %d agent events; want all 3 and the newest 20", ops, agents)
	}
	if a.purgedAgents.Load() != flood-20 || a.purgedOps.Load() != 0 {
		t.Errorf("purged counted %d agents, %d operators; want %d, 0", a.purgedAgents.Load(), a.purgedOps.Load(), flood-20)
	}
	// Operators past their own cap: their oldest go, the agents' stay.
	for i := range 4 {
		a.set(t0.Add(2*time.Minute + time.Duration(i)*time.Second))
		a.call("/corral.pool.v1.NodeService/DeleteNode", &poolv1.DeleteNodeRequest{Name: fmt.Sprintf("ops-late-%d", i)}, nil)
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err := a.purge(context.Background()); n != 2 || err != nil {
		t.Errorf("purge of 7 operator events over a cap of 5: %d, %v; want 2", n, err)
	}
}

// TestAuditRefusedBootLANRate: refused calls of the boot LAN
// (unauthenticated, over an agent rate limit) are recorded at a bounded
// rate, the rest counted; an operator's refused call is always recorded.
func TestAuditRefusedBootLANRate(t *testing.T) {
	st := mem.New()
	a := newTestAudit(t, st, Config{})
	a.run(t)
	agent, err := a.ic.Tokens.Create(context.Background(), authv1.Role_ROLE_AGENT, "agent", 0)
	if err != nil {
		t.Fatal(err)
	}
	limited := status.Error(codes.ResourceExhausted, "Register: token is over its rate limit")
	for range 300 {
		a.callAs(agent, "/corral.node.v1.AgentService/Register", &nodev1.RegisterRequest{BootMac: "52:54:00:00:00:01"}, limited)
		a.callAs("", "/corral.node.v1.AgentService/Register", &nodev1.RegisterRequest{BootMac: "52:54:00:00:00:02"}, nil)
	}
	for range 5 {
		a.call("/corral.pool.v1.NodeService/DeleteNode", &poolv1.DeleteNodeRequest{Name: "n"}, status.Error(codes.ResourceExhausted, "over"))
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	kvs, _ := st.List(context.Background(), auditPrefix)
	var lan, ops int
	for _, kv := range kvs {
		if bootLANKey(kv.Key) {
			lan++
		} else {
			ops++
		}
	}
	// The limiter refills at auditUnauthRate a second of real time: a
	// slow run records a few more.
	if lan < auditUnauthBurst || lan > auditUnauthBurst+10 || ops != 5 {
		t.Errorf("recorded %d boot-LAN refusals and %d operator ones; want about the burst, %d, and all 5", lan, ops, auditUnauthBurst)
	}
	if s := a.suppressed.Load(); s+uint64(lan) != 600 {
		t.Errorf("suppressed %d + recorded %d; want 600", s, lan)
	}
}

// TestAuditCountInto: the counts reach the metrics registry.
func TestAuditCountInto(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	got := fakeCounters{}
	a.CountInto(got)
	a.dropped.Add(3)
	a.purgedAgents.Add(7)
	if v := got[`corral_audit_events_dropped_total{reason="queue_full"}`](); v != 3 {
		t.Errorf("queue_full %d; want 3", v)
	}
	if v := got[`corral_audit_events_purged_total{class="boot_lan"}`](); v != 7 {
		t.Errorf("boot_lan purged %d; want 7", v)
	}
	if len(got) != 5 {
		t.Errorf("%d counters exported; want 5: %v", len(got), got)
	}
}

type fakeCounters map[string]func() uint64

func (f fakeCounters) CounterFunc(name, _ string, labels map[string]string, read func() uint64) {
	for k, v := range labels {
		name += fmt.Sprintf("{%s=%q}", k, v)
	}
	f[name] = read
}
