package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// fakeStandby is StandbyPoolService over one pool, ci.
type fakeStandby struct {
	inventoryv1.UnimplementedStandbyPoolServiceServer
	r *recorder
}

var ciPool = &inventoryv1.StandbyPool{Name: "ci", MinReady: 2, Readiness: inventoryv1.Readiness_READINESS_BOOTED, Selector: "zone=a",
	Erase: inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, AutoAccept: true,
	Status: &inventoryv1.StandbyPoolStatus{Ready: 2, Booted: 1, Allocated: 3, Deficit: 1, LastAction: "powered on m4 into discovery"}}

func (f fakeStandby) ApplyStandbyPool(_ context.Context, req *inventoryv1.ApplyStandbyPoolRequest) (*inventoryv1.ApplyStandbyPoolResponse, error) {
	if err := f.r.record("ApplyStandbyPool", req); err != nil {
		return nil, err
	}
	return &inventoryv1.ApplyStandbyPoolResponse{Pool: req.GetPool()}, nil
}

func (f fakeStandby) GetStandbyPool(_ context.Context, req *inventoryv1.GetStandbyPoolRequest) (*inventoryv1.GetStandbyPoolResponse, error) {
	if err := f.r.record("GetStandbyPool", req); err != nil {
		return nil, err
	}
	if req.GetName() != "ci" {
		return nil, notFound()
	}
	return &inventoryv1.GetStandbyPoolResponse{Pool: ciPool}, nil
}

func (f fakeStandby) ListStandbyPools(_ context.Context, req *inventoryv1.ListStandbyPoolsRequest) (*inventoryv1.ListStandbyPoolsResponse, error) {
	if err := f.r.record("ListStandbyPools", req); err != nil {
		return nil, err
	}
	return &inventoryv1.ListStandbyPoolsResponse{Pools: []*inventoryv1.StandbyPool{ciPool}}, nil
}

func (f fakeStandby) DeleteStandbyPool(_ context.Context, req *inventoryv1.DeleteStandbyPoolRequest) (*inventoryv1.DeleteStandbyPoolResponse, error) {
	if err := f.r.record("DeleteStandbyPool", req); err != nil {
		return nil, err
	}
	return &inventoryv1.DeleteStandbyPoolResponse{}, nil
}

func newStandbyServer(t *testing.T) *testServer {
	t.Helper()
	r := &recorder{fail: map[string]error{}}
	srv := grpc.NewServer()
	inventoryv1.RegisterStandbyPoolServiceServer(srv, fakeStandby{r: r})
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return &testServer{recorder: r, lis: lis}
}

func TestStandbyPoolVerbs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("ci.yaml", "name: ci\nselector: zone=a\nmin_ready: 2\nreadiness: booted\nerase: quick\nauto_accept: true\n")
	off := write("off.yaml", "name: db\nmin_ready: 1\nreadiness: off\n")
	for name, tc := range map[string]struct {
		args   []string
		stdin  string
		code   int
		req    proto.Message
		stdout string
		stderr string
	}{
		"apply": {args: []string{"pool", "apply", "-f", good},
			req: &inventoryv1.ApplyStandbyPoolRequest{Pool: &inventoryv1.StandbyPool{Name: "ci", Selector: "zone=a", MinReady: 2,
				Readiness: inventoryv1.Readiness_READINESS_BOOTED, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, AutoAccept: true}},
			stdout: "ci     booted"},
		"apply off quoted": {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: db\nreadiness: \"off\"\n",
			req: &inventoryv1.ApplyStandbyPoolRequest{Pool: &inventoryv1.StandbyPool{Name: "db",
				Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE}}},
		"apply readiness true": {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: db\nreadiness: on\n", code: ExitUsage, stderr: "want booted or off"},
		"apply off": {args: []string{"pool", "apply", "-f", off},
			req: &inventoryv1.ApplyStandbyPoolRequest{Pool: &inventoryv1.StandbyPool{Name: "db", MinReady: 1,
				Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE}}},
		"apply stdin": {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: ci\nreadiness: booted\n",
			req: &inventoryv1.ApplyStandbyPoolRequest{Pool: &inventoryv1.StandbyPool{Name: "ci",
				Readiness: inventoryv1.Readiness_READINESS_BOOTED, Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE}}},
		"apply bad readiness": {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: ci\nreadiness: warm\n", code: ExitUsage, stderr: "want booted or off"},
		"apply bad erase":     {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: ci\nreadiness: off\nerase: shred\n", code: ExitUsage, stderr: "want none, quick, full or secure"},
		"apply unknown field": {args: []string{"pool", "apply", "-f", "-"}, stdin: "name: ci\nreadiness: off\nmin: 3\n", code: ExitUsage, stderr: "unknown field"},
		"apply no name":       {args: []string{"pool", "apply", "-f", "-"}, stdin: "readiness: off\n", code: ExitUsage, stderr: "name is required"},
		"apply no file":       {args: []string{"pool", "apply"}, code: ExitUsage, stderr: "needs -f FILE"},
		"list": {args: []string{"pool", "list"}, req: &inventoryv1.ListStandbyPoolsRequest{PageSize: listPageSize},
			stdout: "NAME   READINESS   MIN_READY   READY   BOOTED   ALLOCATED   DEFICIT   LAST_ACTION\nci     booted      2           2       1        3           1         powered on m4 into discovery"},
		"list wide": {args: []string{"pool", "list", "-o", "wide"}, req: &inventoryv1.ListStandbyPoolsRequest{PageSize: listPageSize}, stdout: "zone=a     quick   true          -"},
		"get":       {args: []string{"pool", "get", "ci", "-o", "yaml"}, req: &inventoryv1.GetStandbyPoolRequest{Name: "ci"}, stdout: "min_ready: 2"},
		"get none":  {args: []string{"pool", "get", "nope"}, req: &inventoryv1.GetStandbyPoolRequest{Name: "nope"}, code: ExitError, stderr: "not found"},
		"delete":    {args: []string{"pool", "delete", "ci"}, req: &inventoryv1.DeleteStandbyPoolRequest{Name: "ci"}, stdout: "standbypool/ci deleted"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStandbyServer(t)
			r := s.run(t, tc.stdin, nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			if tc.req == nil {
				return
			}
			got := s.received()
			if len(got) != 1 {
				t.Fatalf("requests %v", got)
			}
			if d := cmp.Diff(tc.req, got[0], protocmp.Transform()); d != "" {
				t.Fatalf("request (-want +got):\n%s", d)
			}
		})
	}
}
