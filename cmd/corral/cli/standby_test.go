package cli

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// fakeStandby is StandbyPoolService over one pool, ci, or over pools,
// listed two a page, when set.
type fakeStandby struct {
	inventoryv1.UnimplementedStandbyPoolServiceServer
	r     *recorder
	pools []*inventoryv1.StandbyPool
}

var ciPool = &inventoryv1.StandbyPool{Name: "ci", MinReady: 2, Readiness: inventoryv1.Readiness_READINESS_BOOTED, Selector: "zone=a",
	Erase: inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, AutoAccept: true,
	Status: &inventoryv1.StandbyPoolStatus{Ready: 2, Booted: 1, Warming: 1, Allocated: 3, Deficit: 1, LastAction: "powered on m4 into discovery",
		ReadyMachines: []string{"m1", "m2"}}}

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
	if f.pools == nil {
		return &inventoryv1.ListStandbyPoolsResponse{Pools: []*inventoryv1.StandbyPool{ciPool}}, nil
	}
	from := 0
	if req.GetPageToken() != "" {
		var err error
		if from, err = strconv.Atoi(req.GetPageToken()); err != nil || from < 0 || from > len(f.pools) {
			return nil, status.Error(codes.InvalidArgument, "bad page token")
		}
	}
	to := min(from+2, len(f.pools))
	resp := &inventoryv1.ListStandbyPoolsResponse{Pools: f.pools[from:to]}
	if to < len(f.pools) {
		resp.NextPageToken = strconv.Itoa(to)
	}
	return resp, nil
}

func (f fakeStandby) DeleteStandbyPool(_ context.Context, req *inventoryv1.DeleteStandbyPoolRequest) (*inventoryv1.DeleteStandbyPoolResponse, error) {
	if err := f.r.record("DeleteStandbyPool", req); err != nil {
		return nil, err
	}
	return &inventoryv1.DeleteStandbyPoolResponse{}, nil
}

// newStandbyServer serves fakeStandby over pools (none: ci alone).
func newStandbyServer(t *testing.T, pools ...*inventoryv1.StandbyPool) *testServer {
	t.Helper()
	r := &recorder{fail: map[string]error{}}
	srv := grpc.NewServer()
	inventoryv1.RegisterStandbyPoolServiceServer(srv, fakeStandby{r: r, pools: pools})
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
			stdout: "NAME   READINESS   MIN_READY   READY   BOOTED   WARMING   ALLOCATED   DEFICIT   LAST_ACTION\nci     booted      2           2       1        1         3           1         powered on m4 into discovery"},
		"list wide": {args: []string{"pool", "list", "-o", "wide"}, req: &inventoryv1.ListStandbyPoolsRequest{PageSize: listPageSize}, stdout: "zone=a     quick   true          m1,m2            -"},
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

// corral get standbypools lists the pools a page at a time, like every
// other list; get pool NAME shows one; the status and the names the
// appliance returns print escaped in every format.
func TestGetStandbyPools(t *testing.T) {
	const evil = "\x1b]0;owned\x07\u009b31m\u202eexe"
	var pools []*inventoryv1.StandbyPool
	for i := range 5 {
		pools = append(pools, &inventoryv1.StandbyPool{Name: "p" + strconv.Itoa(i), MinReady: int32(i), Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF,
			Selector: "zone=" + evil, Status: &inventoryv1.StandbyPoolStatus{Ready: int32(i), LastAction: "accepted m" + evil, Conditions: []string{evil}}})
	}
	t.Run("paged", func(t *testing.T) {
		s := newStandbyServer(t, pools...)
		r := s.run(t, "", nil, "get", "standbypools")
		if r.code != ExitOK {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
		for _, p := range pools {
			if !strings.Contains(r.stdout, p.GetName()+" ") {
				t.Errorf("pool %s missing:\n%s", p.GetName(), r.stdout)
			}
		}
		var tokens []string
		for _, req := range s.received() {
			l := req.(*inventoryv1.ListStandbyPoolsRequest)
			if l.GetPageSize() != listPageSize {
				t.Errorf("page size %d, want %d", l.GetPageSize(), listPageSize)
			}
			tokens = append(tokens, l.GetPageToken())
		}
		if want := []string{"", "2", "4"}; !slices.Equal(tokens, want) {
			t.Errorf("page tokens %q, want %q", tokens, want)
		}
	})
	t.Run("limit", func(t *testing.T) {
		s := newStandbyServer(t, pools...)
		r := s.run(t, "", nil, "get", "pools", "--limit", "3", "-o", "name")
		if r.code != ExitOK || strings.Count(r.stdout, "standbypool/") != 3 {
			t.Fatalf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("one", func(t *testing.T) {
		s := newStandbyServer(t)
		r := s.run(t, "", nil, "get", "standbypool", "ci")
		if r.code != ExitOK || !strings.Contains(r.stdout, "powered on m4 into discovery") || !strings.Contains(r.stdout, "READINESS") {
			t.Fatalf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	for _, args := range [][]string{
		{"get", "pools"}, {"get", "pools", "-o", "wide"}, {"get", "pools", "-o", "json"}, {"get", "pools", "-o", "yaml"},
		{"pool", "list", "-o", "wide"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			s := newStandbyServer(t, pools...)
			r := s.run(t, "", nil, args...)
			if r.code != ExitOK {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
				if strings.Contains(r.stdout, bad) {
					t.Errorf("stdout holds %q:\n%q", bad, r.stdout)
				}
			}
		})
	}
}
