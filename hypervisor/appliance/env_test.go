package appliance

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/corralhq/corral/testsupport/fakenode"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

const gib = uint64(1) << 30

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct{ syncbuf.Buffer }

// records returns the JSON log records whose msg is msg.
func (s *syncBuffer) records(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(s.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// env is the services on a real pool, a store, two fake nodes and a gRPC
// server over bufconn.
type env struct {
	svc   *Services
	pool  *pool.Pool
	st    store.Store
	clock *fakeclock.Clock
	nodes map[string]*fakenode.Node
	logs  *syncBuffer
	bs    provisioningv1.BlockStorageServiceClient
	vm    provisioningv1.VirtualMachineServiceClient
	image deploymentv1.ImageServiceClient
}

func newEnv(t testing.TB) *env {
	t.Helper()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	return newEnvOn(t, s)
}

func newBoltEnv(t testing.TB) *env {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return newEnvOn(t, s)
}

func newEnvOn(t testing.TB, st store.Store) *env {
	t.Helper()
	ctx := context.Background()
	clk := fakeclock.New(t0)
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := pool.New(pool.Config{Store: st, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{pool: p, st: st, clock: clk, nodes: map[string]*fakenode.Node{}, logs: logs}
	d := &fakenode.Dialer{}
	for i, name := range []string{"n1", "n2"} {
		n, err := fakenode.Start(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		d.Add(n)
		e.nodes[name] = n
		if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{
			Name: name, Address: "10.1.0." + string(rune('1'+i)), CpuMilliCores: 8000, MemoryBytes: 16 * gib,
			StorageBytes: 100 * gib, Rack: "r" + string(rune('1'+i)), HypervisorPort: 20181,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{
		Name: "net1", Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.1", DnsServers: []string{"10.0.0.53"}, Domain: "lab.example", VlanId: 42,
	}); err != nil {
		t.Fatal(err)
	}
	e.svc, err = New(Config{Store: st, Pool: p, Nodes: d, Logger: log, Now: clk.Now, Owner: "test-owner",
		OpTimeout: time.Minute, NodeCallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Register(srv, e.svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///appliance",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.bs = provisioningv1.NewBlockStorageServiceClient(conn)
	e.vm = provisioningv1.NewVirtualMachineServiceClient(conn)
	e.image = deploymentv1.NewImageServiceClient(conn)
	return e
}

// mkBS creates an empty block storage on node.
func (e *env) mkBS(t testing.TB, name, node string) *provisioningv1.BlockStorage {
	t.Helper()
	bs, err := e.bs.CreateBlockStorage(context.Background(), &provisioningv1.CreateBlockStorageRequest{
		Name: name, RequestBytes: gib, LimitBytes: 2 * gib,
		Annotations: map[string]string{AnnotationBlockStorageRequestNode: node},
	})
	if err != nil {
		t.Fatalf("create block storage %s: %v", name, err)
	}
	return bs
}

func vmReq(name string, disks ...string) *provisioningv1.CreateVirtualMachineRequest {
	return &provisioningv1.CreateVirtualMachineRequest{
		Name: name, RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000,
		RequestMemoryBytes: gib, LimitMemoryBytes: gib,
		BlockStorageNames: disks,
		Nics:              []*provisioningv1.VirtualMachineNIC{{NetworkName: "net1"}},
		LoginUsername:     "corral", SshAuthorizedKeys: []string{"ssh-ed25519 AAAA test"},
	}
}

func wantCode(t testing.TB, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want code %v", status.Code(err), err, code)
	}
	if contains != "" && !strings.Contains(err.Error(), contains) {
		t.Fatalf("error %q does not mention %q", err, contains)
	}
}

// assertVMGone checks that nothing of VM name is left anywhere: record,
// compute, interfaces, IN_USE disks, VM on a node.
func (e *env) assertVMGone(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.svc.GetVirtualMachine(ctx, name); err == nil {
		t.Errorf("record of %s still exists", name)
	}
	nodes, err := e.pool.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, ok := n.GetReservedComputes()[name]; ok {
			t.Errorf("compute %s still reserved on %s", name, n.GetName())
		}
	}
	nets, err := e.pool.ListNetworks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nets {
		for iface, ni := range n.GetReservedNetworkInterfaces() {
			if ni.GetAnnotations()[AnnotationVMReservedBy] == name {
				t.Errorf("interface %s on %s still reserved by %s", iface, n.GetName(), name)
			}
		}
	}
	bss, err := e.svc.ListBlockStorages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range bss {
		if bs.GetAnnotations()[AnnotationUsedBy] == name || (bs.GetState() == bsInUse && bs.GetAnnotations()[AnnotationUsedBy] == "") {
			t.Errorf("block storage %s is %s (used by %q)", bs.GetName(), bs.GetState(), bs.GetAnnotations()[AnnotationUsedBy])
		}
	}
	for _, n := range e.nodes {
		if n.VM(name) != nil {
			t.Errorf("VM %s still on node %s", name, n.Name)
		}
	}
}

// assertBSGone checks that a block storage left no record, budget or
// volume.
func (e *env) assertBSGone(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.svc.GetBlockStorage(ctx, name); err == nil {
		t.Errorf("record of %s still exists", name)
	}
	nodes, _ := e.pool.ListNodes(ctx)
	for _, n := range nodes {
		if _, ok := n.GetReservedStorages()[name]; ok {
			t.Errorf("storage %s still reserved on %s", name, n.GetName())
		}
	}
	for _, n := range e.nodes {
		if n.Volume(name) != nil {
			t.Errorf("volume %s still on node %s", name, n.Name)
		}
	}
}

func (e *env) bsState(t testing.TB, name string) provisioningv1.BlockStorage_BlockStorageState {
	t.Helper()
	bs, err := e.svc.GetBlockStorage(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return bs.GetState()
}

// setNodeState writes a node's state directly (the pool has no sweep yet).
func (e *env) setNodeState(t testing.TB, name string, st poolv1.Node_NodeState) {
	t.Helper()
	if _, err := record.Update(context.Background(), e.st, "/pool/nodes/"+name, func() *poolv1.Node { return &poolv1.Node{} },
		func(n *poolv1.Node, exists bool) (bool, error) { n.State = st; return false, nil }); err != nil {
		t.Fatal(err)
	}
}

var errBoot = status.Error(codes.Internal, "qemu exited: boot failed")
