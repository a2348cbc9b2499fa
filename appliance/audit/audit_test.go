package audit

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/storecheck"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	_ "github.com/corralhq/corral/api/console/v1"    // registers its services for the rules test
	_ "github.com/corralhq/corral/api/deployment/v1" // registers its services for the rules test
	_ "github.com/corralhq/corral/api/fleet/v1"      // registers its services for the rules test
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	_ "github.com/corralhq/corral/api/node/v1"    // registers its services for the rules test
	_ "github.com/corralhq/corral/api/osimage/v1" // registers its services for the rules test
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	_ "github.com/corralhq/corral/api/provisioning/v1" // registers its services for the rules test
	_ "github.com/corralhq/corral/api/webhook/v1"      // registers its services for the rules test
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// TestAuditRulesClassifyEachMethod: each rule names a method that exists;
// reads are named like reads, and no method a viewer may call is taken for
// a mutation. (The appliance's test checks that every method it serves is
// in the table.)
func TestAuditRulesClassifyEachMethod(t *testing.T) {
	readPrefixes := []string{"List", "Get", "Watch", "Timeline", "Download", "FetchArtifact"}
	for method, rule := range auditRules {
		md := methodDescriptor(t, method)
		named := false
		for _, p := range readPrefixes {
			named = named || strings.HasPrefix(string(md.Name()), p)
		}
		if rule.class == auditRead && !named {
			t.Errorf("%s is classified a read but is not named like one", method)
		}
		if rule.class == auditMutating && named {
			t.Errorf("%s is classified mutating but is named like a read", method)
		}
		if a := accessOf(t, method); rule.class == auditMutating && a.GetRole() == authv1.Role_ROLE_VIEWER {
			t.Errorf("%s is classified mutating but a viewer may call it", method)
		}
		if rule.class == auditMutating && rule.field != "" {
			if fd := md.Input().Fields().ByName(protoreflect.Name(rule.field)); fd == nil || fd.Kind() != protoreflect.StringKind {
				t.Errorf("%s: object field %q is not a string field of %s", method, rule.field, md.Input().FullName())
			}
		}
	}
}

func methodDescriptor(t *testing.T, method string) protoreflect.MethodDescriptor {
	t.Helper()
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		t.Fatalf("auditRules names %s: %v", method, err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	if md == nil {
		t.Fatalf("auditRules names %s, which does not exist", method)
	}
	return md
}

func accessOf(t *testing.T, method string) *authv1.Access {
	opts, _ := methodDescriptor(t, method).Options().(*descriptorpb.MethodOptions)
	if opts == nil || !proto.HasExtension(opts, authv1.E_Access) {
		return nil
	}
	a, _ := proto.GetExtension(opts, authv1.E_Access).(*authv1.Access)
	return a
}

// auditView is what the tests compare of an event.
type auditView struct {
	Who, Method, Object, Machine, Code, TokenID, Description string
	Role                                                     authv1.Role
}

func viewOf(evs []*auditv1.AuditEvent) []auditView {
	var out []auditView
	for _, e := range evs {
		out = append(out, auditView{Who: e.GetWho(), Method: strings.TrimPrefix(e.GetMethod(), "/corral."), Object: e.GetObject(), Machine: e.GetMachine(),
			Code: e.GetCode(), TokenID: e.GetTokenId(), Description: e.GetTokenDescription(), Role: e.GetRole()})
	}
	return out
}

// blockingStore delays every audit Put until release is closed.
type blockingStore struct {
	store.Store
	release chan struct{}
}

func (b *blockingStore) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if strings.HasPrefix(key, auditPrefix) {
		select {
		case <-b.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return b.Store.Put(ctx, key, value, rev)
}

// testAuditor is an auditor on st with a clock the test moves (set), and
// the real auth interceptor on the same store with an operator token.
type testAudit struct {
	*Recorder
	ic  *auth.Interceptor
	tok string
	mu  sync.Mutex
	at  time.Time
}

func newTestAudit(t testing.TB, st store.Store, cfg Config) *testAudit {
	t.Helper()
	ta := &testAudit{Recorder: newAuditor(cfg, st, "app-1", slog.New(slog.DiscardHandler)),
		at: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)}
	ta.Recorder.now = func() time.Time { ta.mu.Lock(); defer ta.mu.Unlock(); return ta.at }
	tokens := &auth.Tokens{Store: st}
	tok, err := tokens.Create(context.Background(), authv1.Role_ROLE_OPERATOR, "ops", 0)
	if err != nil {
		t.Fatal(err)
	}
	ta.ic, ta.tok = &auth.Interceptor{Tokens: tokens}, tok
	return ta
}

func (ta *testAudit) set(at time.Time) { ta.mu.Lock(); ta.at = at; ta.mu.Unlock() }

func (ta *testAudit) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// call runs one unary call through the audit and auth interceptors as the
// operator; the handler returns err.
func (ta *testAudit) call(method string, req any, err error) {
	unary, _ := ta.Interceptors()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+ta.tok))
	unary(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		return ta.ic.Unary()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return nil, err })
	})
}

// TestAuditQueueFull: a store that does not answer never slows a call;
// past the queue, events are dropped and counted.
func TestAuditQueueFull(t *testing.T) {
	bs := &blockingStore{Store: mem.New(), release: make(chan struct{})}
	a := newTestAudit(t, bs, Config{Queue: 4})
	a.run(t)
	const calls = 600
	// The store answers nothing until release: if a call waited for it,
	// the loop would never end.
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := range calls {
			a.call("/corral.pool.v1.NodeService/DeleteNode", &poolv1.DeleteNodeRequest{Name: fmt.Sprintf("n-%d", i)}, nil)
		}
	}()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("calls wait for a store that does not answer")
	}
	// The writer holds one batch, blocked in Put, and the queue 4 more.
	// The batch is the first event and whatever reaches the queue while
	// the writer collects (up to auditBatch): usually 1+4, more when the
	// calls outpace the collecting goroutine.
	if d := a.dropped.Load(); d < calls-(auditBatch+4) {
		t.Errorf("dropped %d of %d with a stuck store and a queue of 4", d, calls)
	}
	close(bs.release)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	kvs, _ := bs.List(context.Background(), auditPrefix)
	if got, want := uint64(len(kvs))+a.dropped.Load()+a.suppressed.Load(), uint64(calls); got != want {
		t.Errorf("stored %d + dropped %d + suppressed %d = %d, want %d", len(kvs), a.dropped.Load(), a.suppressed.Load(), got, want)
	}
}

// TestAuditList: since, limit and the filters; newest kept, oldest first.
func TestAuditList(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	a.run(t)
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	// 30 hours of calls, one every 10 minutes, on three machines.
	for i := range 180 {
		a.set(t0.Add(-30*time.Hour + time.Duration(i)*10*time.Minute))
		method := "/corral.inventory.v1.MachineService/SetPower"
		if i%2 == 1 {
			method = "/corral.inventory.v1.MachineService/SetMaintenance"
		}
		a.call(method, &inventoryv1.SetPowerRequest{Name: fmt.Sprintf("m-%d", i%3)}, nil)
	}
	a.set(t0)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	type want struct {
		n           int
		first, last time.Duration // of the events returned, from t0
		err         bool
	}
	tests := map[string]struct {
		req  *auditv1.ListEventsRequest
		want want
	}{
		"default: the last 24 h": {req: &auditv1.ListEventsRequest{}, want: want{n: 144, first: -24 * time.Hour, last: -10 * time.Minute}},
		"since 1 h":              {req: &auditv1.ListEventsRequest{Since: ts(-time.Hour)}, want: want{n: 6, first: -time.Hour, last: -10 * time.Minute}},
		"since in the future":    {req: &auditv1.ListEventsRequest{Since: ts(time.Hour)}, want: want{n: 0}},
		"limit keeps the newest": {req: &auditv1.ListEventsRequest{Limit: 3}, want: want{n: 3, first: -30 * time.Minute, last: -10 * time.Minute}},
		"since 2 days: all":      {req: &auditv1.ListEventsRequest{Since: ts(-48 * time.Hour)}, want: want{n: 180, first: -30 * time.Hour, last: -10 * time.Minute}},
		"machine filter":         {req: &auditv1.ListEventsRequest{Machine: "m-1", Since: ts(-48 * time.Hour)}, want: want{n: 60, first: -30*time.Hour + 10*time.Minute, last: -20 * time.Minute}},
		"object filter":          {req: &auditv1.ListEventsRequest{Object: "machine/m-2", Limit: 2}, want: want{n: 2, first: -40 * time.Minute, last: -10 * time.Minute}},
		"method filter":          {req: &auditv1.ListEventsRequest{Method: "/corral.inventory.v1.MachineService/SetMaintenance", Since: ts(-time.Hour)}, want: want{n: 3, first: -50 * time.Minute, last: -10 * time.Minute}},
		"method filter, short":   {req: &auditv1.ListEventsRequest{Method: "SetPower", Since: ts(-time.Hour)}, want: want{n: 3, first: -time.Hour, last: -20 * time.Minute}},
		"no match":               {req: &auditv1.ListEventsRequest{Machine: "m-9"}, want: want{n: 0}},
		"limit over the maximum": {req: &auditv1.ListEventsRequest{Limit: 5001}, want: want{err: true}},
		"filter too long":        {req: &auditv1.ListEventsRequest{Object: strings.Repeat("x", 600)}, want: want{err: true}},
		"invalid since":          {req: &auditv1.ListEventsRequest{Since: &timestamppb.Timestamp{Nanos: -1}}, want: want{err: true}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			evs, err := a.list(context.Background(), tc.req)
			got := want{n: len(evs), err: err != nil}
			if len(evs) > 0 {
				got.first, got.last = evs[0].GetAt().AsTime().Sub(t0), evs[len(evs)-1].GetAt().AsTime().Sub(t0)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s (err %v)", diff, err)
			}
			for i := 1; i < len(evs); i++ {
				if evs[i].GetId() <= evs[i-1].GetId() {
					t.Fatalf("events out of order: %s after %s", evs[i].GetId(), evs[i-1].GetId())
				}
			}
		})
	}
}

// TestAuditPurge: at most MaxEvents, none older than MaxAge; the newest
// kept.
func TestAuditPurge(t *testing.T) {
	st := mem.New()
	a := newTestAudit(t, st, Config{MaxEvents: 5, MaxAge: time.Hour})
	a.run(t)
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for i := range 10 {
		// 3 older than an hour, 7 within it.
		a.set(t0.Add(-90*time.Minute + time.Duration(i)*10*time.Minute))
		a.call("/corral.pool.v1.NodeService/DeleteNode", &poolv1.DeleteNodeRequest{Name: fmt.Sprintf("n-%d", i)}, nil)
	}
	a.set(t0)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	n, err := a.purge(context.Background())
	if err != nil || n != 5 {
		t.Fatalf("purge: %d, %v; want 5 deleted", n, err)
	}
	evs, err := record.List(context.Background(), st, auditPrefix, func() *auditv1.AuditEvent { return &auditv1.AuditEvent{} })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.GetObject())
	}
	if diff := cmp.Diff([]string{"node/n-5", "node/n-6", "node/n-7", "node/n-8", "node/n-9"}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	// Within both bounds: nothing to do.
	if n, err := a.purge(context.Background()); n != 0 || err != nil {
		t.Errorf("second purge: %d, %v", n, err)
	}
	// Everything ages out.
	a.set(t0.Add(2 * time.Hour))
	if n, err := a.purge(context.Background()); n != 5 || err != nil {
		t.Errorf("purge after two hours: %d, %v; want 5", n, err)
	}
}

// TestAuditStreamNeverReadsMessages: a streaming call (a backup carries
// its passphrase in its request) is recorded by method and caller alone.
func TestAuditStreamNeverReadsMessages(t *testing.T) {
	st := mem.New()
	a := newTestAudit(t, st, Config{})
	a.run(t)
	const passphrase = "correct horse battery staple audit"
	_, stream := a.Interceptors()
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+a.tok))
	method := "/corral.admin.v1.BackupService/Backup"
	err := stream(nil, fakeServerStream{ctx: ctx, msg: &adminv1.BackupRequest{Passphrase: []byte(passphrase)}}, &grpc.StreamServerInfo{FullMethod: method, IsServerStream: true},
		func(srv any, ss grpc.ServerStream) error {
			return a.ic.Stream()(srv, ss, &grpc.StreamServerInfo{FullMethod: method}, func(_ any, ss grpc.ServerStream) error {
				var req adminv1.BackupRequest
				if err := ss.RecvMsg(&req); err != nil {
					return err
				}
				return status.Error(codes.PermissionDenied, "needs ADMIN") // the operator may not
			})
		})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("backup: %v", err)
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, err := a.list(context.Background(), &auditv1.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]auditView{{Who: viewOf(evs)[0].Who, Method: "admin.v1.BackupService/Backup", Object: "backup", Code: "PermissionDenied",
		TokenID: viewOf(evs)[0].TokenID, Description: "ops", Role: authv1.Role_ROLE_OPERATOR}}, viewOf(evs)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	storecheck.NoSecrets(t, st, map[string]string{"backup passphrase": passphrase, "token": a.tok}, &auditv1.ListEventsResponse{Events: evs})
}

// fakeServerStream is a server stream whose one incoming message is msg.
type fakeServerStream struct {
	grpc.ServerStream
	ctx context.Context
	msg proto.Message
}

func (f fakeServerStream) Context() context.Context { return f.ctx }
func (f fakeServerStream) RecvMsg(m any) error {
	proto.Merge(m.(proto.Message), f.msg)
	return nil
}

// BenchmarkAuditCall prints what the audit adds to a call (auth's token
// check on a bbolt store alone vs audit + auth) and how fast the writer
// stores events on bbolt (events/s, and how many a tight loop of calls
// made it drop).
func BenchmarkAuditCall(b *testing.B) {
	st, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	a := newTestAudit(b, st, Config{})
	a.set(time.Now())
	a.now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	req := &poolv1.DeleteNodeRequest{Name: "n-1"}
	method := "/corral.pool.v1.NodeService/DeleteNode"
	b.Run("auth only", func(b *testing.B) {
		md := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+a.tok))
		for b.Loop() {
			a.ic.Unary()(md, req, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return nil, nil })
		}
	})
	b.Run("audit and auth", func(b *testing.B) {
		d0 := a.dropped.Load()
		kvs0, _ := st.List(context.Background(), auditPrefix)
		start := time.Now()
		for b.Loop() {
			a.call(method, req, nil)
		}
		if err := a.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		kvs, _ := st.List(context.Background(), auditPrefix)
		stored := len(kvs) - len(kvs0)
		b.ReportMetric(float64(stored)/took.Seconds(), "stored/s")
		b.ReportMetric(float64(a.dropped.Load()-d0), "dropped")
	})
}

func TestConfigCheck(t *testing.T) {
	tests := map[string]struct {
		cfg  Config
		want string // "" = accepted
	}{
		"defaults":           {},
		"set":                {cfg: Config{Queue: 16, MaxEvents: 10, MaxAge: time.Hour}},
		"negative queue":     {cfg: Config{Queue: -1}, want: "--audit-queue -1: must be positive"},
		"negative max":       {cfg: Config{MaxEvents: -5}, want: "--audit-max-events -5: must be positive"},
		"negative retention": {cfg: Config{MaxAge: -time.Hour}, want: "--audit-max-age -1h0m0s: must be positive"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.check()
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("check: %v; want %q", err, tc.want)
			}
		})
	}
}
