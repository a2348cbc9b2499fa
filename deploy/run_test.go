package deploy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// behaviour is what the fake does for a request naming a task.
type behaviour struct {
	delay time.Duration
	err   error
	// after: do not answer before this task has started.
	after string
	// block: wait for the call's context to end.
	block bool
	// times: answer err to the first times calls only (0: to every call).
	times int
}

// fakePool answers every method of every service (gRPC unknown-service
// handler) with a Node named like the request, recording the order in
// which calls start and end and how many run at once.
type fakePool struct {
	mu          sync.Mutex
	behave      map[string]behaviour
	events      []string // "start X", "end X"
	methods     []string // full method of each call, in start order
	inflight    int
	maxInflight int
	started     map[string]chan struct{}
	calls       map[string]int
}

func newFakePool(behave map[string]behaviour) *fakePool {
	return &fakePool{behave: behave, started: map[string]chan struct{}{}, calls: map[string]int{}}
}

func (f *fakePool) startedCh(name string) chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch, ok := f.started[name]
	if !ok {
		ch = make(chan struct{})
		f.started[name] = ch
	}
	return ch
}

func (f *fakePool) handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	req := &poolv1.GetNodeRequest{}
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	name := req.GetName()
	f.mu.Lock()
	f.events = append(f.events, "start "+name)
	f.methods = append(f.methods, method)
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	b := f.behave[name]
	f.calls[name]++
	call := f.calls[name]
	f.mu.Unlock()
	if call == 1 { // a retry's task has started already
		close(f.startedCh(name))
	}
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.events = append(f.events, "end "+name)
		f.mu.Unlock()
	}()

	ctx := stream.Context()
	if b.after != "" {
		select {
		case <-f.startedCh(b.after):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if b.block {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	select {
	case <-time.After(b.delay):
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	return f.answer(stream, name, b, call)
}

func (f *fakePool) answer(stream grpc.ServerStream, name string, b behaviour, call int) error {
	if b.err != nil && (b.times == 0 || call <= b.times) {
		return b.err
	}
	return stream.SendMsg(&poolv1.Node{Name: name})
}

func (f *fakePool) snapshot() (events, methods []string, maxInflight int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...), append([]string(nil), f.methods...), f.maxInflight
}

// serve starts f on bufconn and returns a client connection to it.
func serve(t *testing.T, f *fakePool) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(f.handle))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}

// dag builds a file of GetNode tasks named after their keys. deps maps a
// task to its depends_on; ignore lists tasks with ignore_error.
func dag(t *testing.T, names []string, deps map[string][]string, ignore ...string) *Plan {
	t.Helper()
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s:\n  type: Node\n  action: GetNode\n  args: {name: %s}\n", n, n)
		if d := deps[n]; len(d) > 0 {
			fmt.Fprintf(&b, "  depends_on: [%s]\n", strings.Join(d, ", "))
		}
		for _, i := range ignore {
			if i == n {
				b.WriteString("  ignore_error: true\n")
			}
		}
	}
	p, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", b.String(), err)
	}
	return p
}

// outcomes maps task name to "outcome" or "outcome: reason".
func outcomes(s *Summary) map[string]string {
	m := map[string]string{}
	for _, r := range s.Results {
		v := r.Outcome.String()
		if r.Reason != "" {
			v += ": " + r.Reason
		}
		m[r.Task.Name] = v
	}
	return m
}

func TestRunDependencyOrder(t *testing.T) {
	//   a ─┬─ c ─┐
	//   b ─┘     ├─ e
	//   d ───────┘
	f := newFakePool(map[string]behaviour{
		"a": {delay: 30 * time.Millisecond},
		"b": {delay: 5 * time.Millisecond},
		"d": {delay: 50 * time.Millisecond},
	})
	deps := map[string][]string{"c": {"a", "b"}, "e": {"c", "d"}}
	p := dag(t, []string{"e", "c", "a", "b", "d"}, deps)
	var evs []string
	r := &Runner{Conn: serve(t, f), Parallel: 8, Progress: func(e Event) {
		if e.Kind == Started {
			evs = append(evs, "started "+e.Task.Name)
		} else {
			evs = append(evs, fmt.Sprintf("%s %s %d/%d", e.Result.Outcome, e.Task.Name, e.Done, e.Total))
		}
	}}
	s, err := r.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if s.Succeeded != 5 || s.Failed+s.Ignored+s.Skipped != 0 {
		t.Errorf("summary %+v", s)
	}
	events, _, _ := f.snapshot()
	pos := map[string]int{}
	for i, e := range events {
		pos[e] = i
	}
	for task, ds := range deps {
		for _, d := range ds {
			if pos["end "+d] > pos["start "+task] {
				t.Errorf("%s started before its dependency %s ended: %v", task, d, events)
			}
		}
	}
	// a, b and d start together, before anything ends.
	for _, n := range []string{"a", "b", "d"} {
		if pos["start "+n] > 2 {
			t.Errorf("independent task %s did not start at once: %v", n, events)
		}
	}
	if got := evs[len(evs)-1]; got != "succeeded e 5/5" {
		t.Errorf("last event %q, all: %v", got, evs)
	}
	for _, res := range s.Results {
		if res.Response == nil || res.Elapsed <= 0 {
			t.Errorf("%s: response %v elapsed %v", res.Task.Name, res.Response, res.Elapsed)
		}
	}
}

func TestRunParallelLimit(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			behave := map[string]behaviour{}
			var names []string
			for i := 0; i < 10; i++ {
				n := fmt.Sprintf("t%d", i)
				names = append(names, n)
				behave[n] = behaviour{delay: 20 * time.Millisecond}
			}
			f := newFakePool(behave)
			s, err := (&Runner{Conn: serve(t, f), Parallel: limit}).Run(context.Background(), dag(t, names, nil))
			if err != nil {
				t.Fatal(err)
			}
			_, _, got := f.snapshot()
			if got != limit {
				t.Errorf("max in flight %d, want %d", got, limit)
			}
			if s.Succeeded != 10 {
				t.Errorf("summary %+v", s)
			}
		})
	}
}

func TestRunFailFastDrains(t *testing.T) {
	// slow is in flight when boom fails; it must finish (drain) and
	// succeed. waits would start next (Parallel 2) but must not; child
	// depends on boom; grandchild on child.
	f := newFakePool(map[string]behaviour{
		"boom": {after: "slow", err: status.Error(codes.FailedPrecondition, "node n1 is not READY")},
		"slow": {delay: 150 * time.Millisecond},
	})
	p := dag(t, []string{"boom", "slow", "waits", "child", "grandchild"},
		map[string][]string{"child": {"boom"}, "grandchild": {"child"}})
	s, err := (&Runner{Conn: serve(t, f), Parallel: 2}).Run(context.Background(), p)
	if !errors.Is(err, ErrTaskFailed) || !strings.Contains(err.Error(), `"boom"`) {
		t.Fatalf("err = %v, want ErrTaskFailed naming boom", err)
	}
	want := map[string]string{
		"boom":       "failed",
		"slow":       "succeeded",
		"waits":      `skipped: run stopped after "boom" failed`,
		"child":      `skipped: dependency "boom" failed`,
		"grandchild": `skipped: dependency "child" was skipped`,
	}
	if diff := cmp.Diff(want, outcomes(s)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	events, _, _ := f.snapshot()
	if diff := cmp.Diff([]string{"start boom", "start slow", "end boom", "end slow"}, events); diff != "" && !cmp.Equal([]string{"start slow", "start boom", "end boom", "end slow"}, events) {
		t.Errorf("server saw %v: slow must be drained, nothing else started", events)
	}
	if code := status.Code(s.Results[0].Err); code != codes.FailedPrecondition {
		t.Errorf("boom error %v", s.Results[0].Err)
	}
	if s.Failed != 1 || s.Succeeded != 1 || s.Skipped != 3 {
		t.Errorf("summary %+v", s)
	}
}

func TestRunIgnoreError(t *testing.T) {
	// n0stack's idempotent idiom: delete (may fail) then create.
	f := newFakePool(map[string]behaviour{
		"delete": {err: status.Error(codes.NotFound, "no such network")},
	})
	p := dag(t, []string{"delete", "create", "use"}, map[string][]string{"create": {"delete"}, "use": {"create"}}, "delete")
	s, err := (&Runner{Conn: serve(t, f)}).Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"delete": "ignored failure", "create": "succeeded", "use": "succeeded"}
	if diff := cmp.Diff(want, outcomes(s)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if s.Ignored != 1 || s.Succeeded != 2 || status.Code(s.Results[0].Err) != codes.NotFound {
		t.Errorf("summary %+v, delete error %v", s, s.Results[0].Err)
	}
}

func TestRunTaskTimeout(t *testing.T) {
	f := newFakePool(map[string]behaviour{"hang": {block: true}})
	p := dag(t, []string{"hang", "after"}, map[string][]string{"after": {"hang"}})
	s, err := (&Runner{Conn: serve(t, f), TaskTimeout: 50 * time.Millisecond}).Run(context.Background(), p)
	if !errors.Is(err, ErrTaskFailed) {
		t.Fatalf("err = %v", err)
	}
	if code := status.Code(s.Results[0].Err); code != codes.DeadlineExceeded {
		t.Errorf("hang: %v, want DeadlineExceeded", s.Results[0].Err)
	}
	if s.Results[1].Outcome != Skipped {
		t.Errorf("after: %v", s.Results[1].Outcome)
	}
}

func TestRunInterrupt(t *testing.T) {
	f := newFakePool(map[string]behaviour{"hang": {block: true}})
	p := dag(t, []string{"hang", "later", "other"}, map[string][]string{"later": {"hang"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Runner{Conn: serve(t, f), Parallel: 1, Progress: func(e Event) {
		if e.Kind == Started && e.Task.Name == "hang" {
			go func() {
				<-f.startedCh("hang")
				cancel()
			}()
		}
	}}
	s, err := r.Run(ctx, p)
	if !errors.Is(err, ErrTaskFailed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want ErrTaskFailed and context.Canceled", err)
	}
	want := map[string]string{
		"hang":  "failed",
		"later": `skipped: dependency "hang" failed`,
		"other": `skipped: run interrupted`,
	}
	if diff := cmp.Diff(want, outcomes(s)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if code := status.Code(s.Results[0].Err); code != codes.Canceled {
		t.Errorf("hang: %v", s.Results[0].Err)
	}
}

func TestRunInterruptBeforeStart(t *testing.T) {
	f := newFakePool(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := (&Runner{Conn: serve(t, f)}).Run(ctx, dag(t, []string{"a"}, nil))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "skipped: run interrupted"}, outcomes(s)); diff != "" {
		t.Error(diff)
	}
	if ev, _, _ := f.snapshot(); len(ev) != 0 {
		t.Errorf("calls after cancel: %v", ev)
	}
}

func TestRunConfig(t *testing.T) {
	p := dag(t, []string{"a"}, nil)
	for name, r := range map[string]*Runner{
		"nil conn":         {},
		"negative":         {Conn: &grpc.ClientConn{}, Parallel: -1},
		"negative timeout": {Conn: &grpc.ClientConn{}, TaskTimeout: -time.Second},
	} {
		if _, err := r.Run(context.Background(), p); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := (&Runner{Conn: &grpc.ClientConn{}}).Run(context.Background(), nil); err == nil {
		t.Error("nil plan: no error")
	}
}

// TestRunGenericMethods checks that tasks reach the method path their type
// and action name, whatever the service.
func TestRunGenericMethods(t *testing.T) {
	f := newFakePool(nil)
	p, err := Parse([]byte(`
vm:
  type: VirtualMachine
  action: BootVirtualMachine
  args: {name: vm}
img:
  type: Image
  action: DeleteImage
  args: {name: img}
  depends_on: [vm]
m:
  type: Machine
  action: GetMachine
  args: {name: m}
  depends_on: [img]
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&Runner{Conn: serve(t, f)}).Run(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	_, methods, _ := f.snapshot()
	want := []string{
		"/corral.provisioning.v1.VirtualMachineService/BootVirtualMachine",
		"/corral.deployment.v1.ImageService/DeleteImage",
		"/corral.inventory.v1.MachineService/GetMachine",
	}
	if diff := cmp.Diff(want, methods); diff != "" {
		t.Errorf("methods (-want +got):\n%s", diff)
	}
}
