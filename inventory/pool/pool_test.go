package pool

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

const (
	gib = uint64(1) << 30
	tib = uint64(1) << 40
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// env is a Pool on a store with a fixed clock.
type env struct {
	p     *Pool
	s     store.Store
	clock *fakeclock.Clock
}

// newEnv returns a Pool on a fresh in-memory store; mods adjust its Config.
func newEnv(t testing.TB, mods ...func(*Config)) *env {
	t.Helper()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	return newEnvOn(t, s, mods...)
}

// newBoltEnv returns a Pool on a fresh bolt store in t.TempDir().
func newBoltEnv(t testing.TB, mods ...func(*Config)) *env {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return newEnvOn(t, s, mods...)
}

func newEnvOn(t testing.TB, s store.Store, mods ...func(*Config)) *env {
	t.Helper()
	c := fakeclock.New(t0)
	cfg := Config{Store: s, Now: c.Now}
	for _, m := range mods {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{p: p, s: s, clock: c}
}

// nodeReq is an ApplyNodeRequest for a node of the given capacity.
func nodeReq(name string, milli uint32, mem, storage uint64) *poolv1.ApplyNodeRequest {
	return &poolv1.ApplyNodeRequest{Name: name, CpuMilliCores: milli, MemoryBytes: mem, StorageBytes: storage}
}

func (e *env) applyNode(t testing.TB, req *poolv1.ApplyNodeRequest) *poolv1.Node {
	t.Helper()
	n, err := e.p.ApplyNode(context.Background(), req)
	if err != nil {
		t.Fatalf("ApplyNode(%s): %v", req.GetName(), err)
	}
	return n
}

func (e *env) applyNetwork(t testing.TB, req *poolv1.ApplyNetworkRequest) *poolv1.Network {
	t.Helper()
	n, err := e.p.ApplyNetwork(context.Background(), req)
	if err != nil {
		t.Fatalf("ApplyNetwork(%s): %v", req.GetName(), err)
	}
	return n
}

func (e *env) reserveCompute(t testing.TB, node, name string, c *poolv1.Compute) *poolv1.Node {
	t.Helper()
	n, err := e.p.ReserveCompute(context.Background(), node, name, c)
	if err != nil {
		t.Fatalf("ReserveCompute(%s, %s): %v", node, name, err)
	}
	return n
}

func (e *env) reserveNIC(t testing.TB, req *poolv1.ReserveNetworkInterfaceRequest) *poolv1.NetworkInterface {
	t.Helper()
	n, err := e.p.ReserveNetworkInterface(context.Background(), req)
	if err != nil {
		t.Fatalf("ReserveNetworkInterface(%s, %s): %v", req.GetNetworkName(), req.GetNetworkInterfaceName(), err)
	}
	return n.GetReservedNetworkInterfaces()[req.GetNetworkInterfaceName()]
}

// setNodeState writes a node's state straight into its record, the way a
// heartbeat watcher would (nothing in the pool sets NOT_READY yet).
func (e *env) setNodeState(t testing.TB, name string, st poolv1.Node_NodeState) {
	t.Helper()
	ctx := context.Background()
	n := &poolv1.Node{}
	rev, err := record.Get(ctx, e.s, nodePrefix+name, n)
	if err != nil {
		t.Fatal(err)
	}
	n.State = st
	if _, err := record.Put(ctx, e.s, nodePrefix+name, n, rev); err != nil {
		t.Fatal(err)
	}
}

// compute is a Compute with equal requests and limits.
func compute(milli uint32, mem uint64) *poolv1.Compute {
	return &poolv1.Compute{RequestCpuMilliCore: milli, LimitCpuMilliCore: milli, RequestMemoryBytes: mem, LimitMemoryBytes: mem}
}

// snapshot is everything a test can observe in the store.
type snapshot struct {
	Nodes    []*poolv1.Node
	Networks []*poolv1.Network
	Raw      []store.KV
}

func (e *env) snapshot(t testing.TB) snapshot {
	t.Helper()
	ctx := context.Background()
	nodes, err := e.p.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := e.p.ListNetworks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := e.s.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	return snapshot{Nodes: nodes, Networks: nets, Raw: raw}
}

// assertUnchanged fails t if anything stored, down to raw bytes and
// revisions, differs from before.
func (e *env) assertUnchanged(t testing.TB, before snapshot) {
	t.Helper()
	if diff := cmp.Diff(before, e.snapshot(t), protocmp.Transform()); diff != "" {
		t.Errorf("store changed by a refused call (-before +after):\n%s", diff)
	}
}

// wantErr checks that err wraps want (nil: no error).
func wantErr(t testing.TB, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("error = %v, want one wrapping %v", err, want)
	}
}

func wantContains(t testing.TB, err error, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v does not mention %q", err, s)
		}
	}
}

func TestNewConfig(t *testing.T) {
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	tests := map[string]struct {
		cfg     Config
		wantErr error
		want    [3]float64 // cpu, memory, storage ratios after defaults
	}{
		"defaults":        {cfg: Config{Store: s}, want: [3]float64{4, 1, 1}},
		"explicit":        {cfg: Config{Store: s, CPULimitRatio: 2, MemoryLimitRatio: 1.5, StorageLimitRatio: 3}, want: [3]float64{2, 1.5, 3}},
		"no store":        {cfg: Config{}, wantErr: apierr.ErrInvalid},
		"ratio below one": {cfg: Config{Store: s, CPULimitRatio: 0.5}, wantErr: apierr.ErrInvalid},
		"negative ratio":  {cfg: Config{Store: s, MemoryLimitRatio: -1}, wantErr: apierr.ErrInvalid},
		"NaN ratio":       {cfg: Config{Store: s, StorageLimitRatio: math.NaN()}, wantErr: apierr.ErrInvalid},
		"infinite ratio":  {cfg: Config{Store: s, CPULimitRatio: math.Inf(1)}, want: [3]float64{math.Inf(1), 1, 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := New(tc.cfg)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				return
			}
			got := [3]float64{p.cfg.CPULimitRatio, p.cfg.MemoryLimitRatio, p.cfg.StorageLimitRatio}
			if got != tc.want {
				t.Errorf("ratios = %v, want %v", got, tc.want)
			}
			if p.cfg.Now == nil || p.log == nil {
				t.Error("Now or Logger not defaulted")
			}
		})
	}
}

// TestBadNames runs every name-taking call with malformed names and checks
// each is refused with apierr.ErrInvalid and stores nothing.
func TestBadNames(t *testing.T) {
	names := map[string]string{
		"empty":      "",
		"slash":      "a/b",
		"leading sp": " x",
		"trail sp":   "x ",
		"dash first": "-x",
		"dash last":  "x-",
		"dot only":   ".",
		"dotdot":     "..",
		"too long":   strings.Repeat("a", 200),
		"129 chars":  strings.Repeat("a", 129),
		"unicode":    "ünïcode",
		"newline":    "a\nb",
		"nul":        "a\x00b",
	}
	ctx := context.Background()
	c := compute(1000, gib)
	st := &poolv1.Storage{RequestBytes: gib, LimitBytes: gib}
	ops := map[string]func(p *Pool, bad string) error{
		"ApplyNode": func(p *Pool, bad string) error {
			_, err := p.ApplyNode(ctx, nodeReq(bad, 1000, gib, 0))
			return err
		},
		"GetNode":    func(p *Pool, bad string) error { _, err := p.GetNode(ctx, bad); return err },
		"DeleteNode": func(p *Pool, bad string) error { return p.DeleteNode(ctx, bad) },
		"ReserveCompute node": func(p *Pool, bad string) error {
			_, err := p.ReserveCompute(ctx, bad, "vm", c)
			return err
		},
		"ReserveCompute compute": func(p *Pool, bad string) error {
			_, err := p.ReserveCompute(ctx, "n1", bad, c)
			return err
		},
		"ReleaseCompute node":    func(p *Pool, bad string) error { return p.ReleaseCompute(ctx, bad, "vm") },
		"ReleaseCompute compute": func(p *Pool, bad string) error { return p.ReleaseCompute(ctx, "n1", bad) },
		"ScheduleCompute": func(p *Pool, bad string) error {
			_, err := p.ScheduleCompute(ctx, bad, c)
			return err
		},
		"ReserveStorage node": func(p *Pool, bad string) error {
			_, err := p.ReserveStorage(ctx, bad, "vol", st)
			return err
		},
		"ReserveStorage storage": func(p *Pool, bad string) error {
			_, err := p.ReserveStorage(ctx, "n1", bad, st)
			return err
		},
		"ReleaseStorage node":    func(p *Pool, bad string) error { return p.ReleaseStorage(ctx, bad, "vol") },
		"ReleaseStorage storage": func(p *Pool, bad string) error { return p.ReleaseStorage(ctx, "n1", bad) },
		"ScheduleStorage": func(p *Pool, bad string) error {
			_, err := p.ScheduleStorage(ctx, bad, st)
			return err
		},
		"ApplyNetwork": func(p *Pool, bad string) error {
			_, err := p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: bad, Ipv4Cidr: "10.9.0.0/24"})
			return err
		},
		"GetNetwork":    func(p *Pool, bad string) error { _, err := p.GetNetwork(ctx, bad); return err },
		"DeleteNetwork": func(p *Pool, bad string) error { return p.DeleteNetwork(ctx, bad) },
		"ReserveNetworkInterface network": func(p *Pool, bad string) error {
			_, err := p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: bad, NetworkInterfaceName: "eth0"})
			return err
		},
		"ReserveNetworkInterface interface": func(p *Pool, bad string) error {
			_, err := p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "net", NetworkInterfaceName: bad})
			return err
		},
		"ReleaseNetworkInterface network":   func(p *Pool, bad string) error { return p.ReleaseNetworkInterface(ctx, bad, "eth0") },
		"ReleaseNetworkInterface interface": func(p *Pool, bad string) error { return p.ReleaseNetworkInterface(ctx, "net", bad) },
	}
	e := newEnv(t)
	e.applyNode(t, nodeReq("n1", 4000, 4*gib, 4*gib))
	e.reserveCompute(t, "n1", "vm", c)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "net", Ipv4Cidr: "10.0.0.0/24"})
	e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "net", NetworkInterfaceName: "eth0"})
	for op, call := range ops {
		for nameKey, bad := range names {
			t.Run(op+"/"+nameKey, func(t *testing.T) {
				before := e.snapshot(t)
				err := call(e.p, bad)
				wantErr(t, err, apierr.ErrInvalid)
				e.assertUnchanged(t, before)
			})
		}
	}
}

// TestGoodNames checks the edges of what checkName accepts.
func TestGoodNames(t *testing.T) {
	tests := map[string]string{
		"one char":  "a",
		"digit":     "0",
		"128 chars": strings.Repeat("a", 128),
		"dots":      "node-01.rack-2.dc1",
		"underbar":  "a_b",
		"mixed":     "Node_01-b.x",
	}
	for name, n := range tests {
		t.Run(name, func(t *testing.T) {
			if err := CheckName("name", n); err != nil {
				t.Fatal(err)
			}
			e := newEnv(t)
			e.applyNode(t, nodeReq(n, 1000, gib, 0))
			got, err := e.p.GetNode(context.Background(), n)
			if err != nil || got.GetName() != n {
				t.Fatalf("GetNode(%q) = %v, %v", n, got, err)
			}
		})
	}
}
