package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	"github.com/corralhq/corral/api/clientconfig"
	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// recorder keeps every request the fakes receive, in arrival order, and
// the records they serve.
type recorder struct {
	mu       sync.Mutex
	requests []proto.Message

	nodes    map[string]*poolv1.Node
	networks map[string]*poolv1.Network
	machines map[string]*inventoryv1.Machine
	// fail, when set for an RPC method name (e.g. "ApplyNetwork"), is
	// returned by that method instead of its normal answer.
	fail map[string]error

	// streams scripts the Watch calls of a method (e.g. "WatchMachines"):
	// each call takes the next step; past the last, a call waits for the
	// client to go away.
	streams map[string][]streamStep
	// opened receives the method name of every Watch call (buffered).
	opened chan string

	events []*auditv1.AuditEvent // ListEvents answer
}

// streamStep is one scripted Watch call: the events it sends, then the
// status it ends with (nil: it waits for the client to go away).
type streamStep struct {
	events []proto.Message
	end    error
}

// serveStream plays the next scripted step of method on a server stream.
func serveStream[E any](r *recorder, method string, req proto.Message, ss grpc.ServerStreamingServer[E]) error {
	if err := r.record(method, req); err != nil {
		return err
	}
	r.mu.Lock()
	var st *streamStep
	if steps := r.streams[method]; len(steps) > 0 {
		st = &steps[0]
		r.streams[method] = steps[1:]
	}
	r.mu.Unlock()
	select {
	case r.opened <- method:
	default:
	}
	if st != nil {
		for _, e := range st.events {
			if err := ss.Send(any(e).(*E)); err != nil {
				return err
			}
		}
		if st.end != nil {
			return st.end
		}
	}
	<-ss.Context().Done()
	return nil
}

func (f fakeMachines) WatchMachines(req *inventoryv1.WatchMachinesRequest, ss grpc.ServerStreamingServer[inventoryv1.MachineEvent]) error {
	return serveStream(f.r, "WatchMachines", req, ss)
}

func (f fakeMachines) WatchTimeline(req *inventoryv1.WatchTimelineRequest, ss grpc.ServerStreamingServer[inventoryv1.TimelineEvent]) error {
	return serveStream(f.r, "WatchTimeline", req, ss)
}

func (f fakeNodes) WatchNodes(req *poolv1.WatchNodesRequest, ss grpc.ServerStreamingServer[poolv1.NodeEvent]) error {
	return serveStream(f.r, "WatchNodes", req, ss)
}

func (f fakeNetworks) WatchNetworks(req *poolv1.WatchNetworksRequest, ss grpc.ServerStreamingServer[poolv1.NetworkEvent]) error {
	return serveStream(f.r, "WatchNetworks", req, ss)
}

func (f fakeBlockStorages) WatchBlockStorages(req *provisioningv1.WatchBlockStoragesRequest, ss grpc.ServerStreamingServer[provisioningv1.BlockStorageEvent]) error {
	return serveStream(f.r, "WatchBlockStorages", req, ss)
}

func (f fakeVMs) WatchVirtualMachines(req *provisioningv1.WatchVirtualMachinesRequest, ss grpc.ServerStreamingServer[provisioningv1.VirtualMachineEvent]) error {
	return serveStream(f.r, "WatchVirtualMachines", req, ss)
}

type fakeAudit struct {
	auditv1.UnimplementedAuditServiceServer
	r *recorder
}

func (f fakeAudit) ListEvents(_ context.Context, req *auditv1.ListEventsRequest) (*auditv1.ListEventsResponse, error) {
	if err := f.r.record("ListEvents", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	resp := &auditv1.ListEventsResponse{}
	for _, e := range f.r.events {
		if req.GetMachine() != "" && e.GetMachine() != req.GetMachine() {
			continue
		}
		if req.GetSince() != nil && e.GetAt().AsTime().Before(req.GetSince().AsTime()) {
			continue
		}
		resp.Events = append(resp.Events, e)
	}
	return resp, nil
}

func (f fakeAudit) WatchEvents(req *auditv1.WatchEventsRequest, ss grpc.ServerStreamingServer[auditv1.AuditStreamEvent]) error {
	return serveStream(f.r, "WatchEvents", req, ss)
}

func (r *recorder) record(method string, req proto.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, proto.Clone(req))
	return r.fail[method]
}

func (r *recorder) received() []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Message(nil), r.requests...)
}

func notFound() error { return status.Error(codes.NotFound, "not found") }

type fakeNodes struct {
	poolv1.UnimplementedNodeServiceServer
	r *recorder
}

func (f fakeNodes) ListNodes(_ context.Context, req *poolv1.ListNodesRequest) (*poolv1.ListNodesResponse, error) {
	if err := f.r.record("ListNodes", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	resp := &poolv1.ListNodesResponse{}
	for _, n := range f.r.nodes {
		resp.Nodes = append(resp.Nodes, n)
	}
	return resp, nil
}

func (f fakeNodes) getNode(name string) (*poolv1.Node, error) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	n, ok := f.r.nodes[name]
	if !ok {
		return nil, notFound()
	}
	return proto.Clone(n).(*poolv1.Node), nil
}

func (f fakeNodes) GetNode(_ context.Context, req *poolv1.GetNodeRequest) (*poolv1.Node, error) {
	if err := f.r.record("GetNode", req); err != nil {
		return nil, err
	}
	return f.getNode(req.GetName())
}

func (f fakeNodes) ApplyNode(_ context.Context, req *poolv1.ApplyNodeRequest) (*poolv1.Node, error) {
	if err := f.r.record("ApplyNode", req); err != nil {
		return nil, err
	}
	return &poolv1.Node{Name: req.GetName()}, nil
}

func (f fakeNodes) DeleteNode(_ context.Context, req *poolv1.DeleteNodeRequest) (*emptypb.Empty, error) {
	if err := f.r.record("DeleteNode", req); err != nil {
		return nil, err
	}
	if _, err := f.getNode(req.GetName()); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (f fakeNodes) ReserveCompute(_ context.Context, req *poolv1.ReserveComputeRequest) (*poolv1.Node, error) {
	if err := f.r.record("ReserveCompute", req); err != nil {
		return nil, err
	}
	n, err := f.getNode(req.GetNodeName())
	if err != nil {
		return nil, err
	}
	if n.ReservedComputes == nil {
		n.ReservedComputes = map[string]*poolv1.Compute{}
	}
	n.ReservedComputes[req.GetComputeName()] = &poolv1.Compute{
		Annotations:         req.GetAnnotations(),
		RequestCpuMilliCore: req.GetRequestCpuMilliCore(),
		LimitCpuMilliCore:   req.GetLimitCpuMilliCore(),
		RequestMemoryBytes:  req.GetRequestMemoryBytes(),
		LimitMemoryBytes:    req.GetLimitMemoryBytes(),
	}
	return n, nil
}

func (f fakeNodes) ScheduleCompute(_ context.Context, req *poolv1.ScheduleComputeRequest) (*poolv1.Node, error) {
	if err := f.r.record("ScheduleCompute", req); err != nil {
		return nil, err
	}
	return f.getNode("n1")
}

func (f fakeNodes) ReleaseCompute(_ context.Context, req *poolv1.ReleaseComputeRequest) (*emptypb.Empty, error) {
	if err := f.r.record("ReleaseCompute", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (f fakeNodes) ReserveStorage(_ context.Context, req *poolv1.ReserveStorageRequest) (*poolv1.Node, error) {
	if err := f.r.record("ReserveStorage", req); err != nil {
		return nil, err
	}
	return f.getNode(req.GetNodeName())
}

func (f fakeNodes) ScheduleStorage(_ context.Context, req *poolv1.ScheduleStorageRequest) (*poolv1.Node, error) {
	if err := f.r.record("ScheduleStorage", req); err != nil {
		return nil, err
	}
	return f.getNode("n1")
}

func (f fakeNodes) ReleaseStorage(_ context.Context, req *poolv1.ReleaseStorageRequest) (*emptypb.Empty, error) {
	if err := f.r.record("ReleaseStorage", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

type fakeNetworks struct {
	poolv1.UnimplementedNetworkServiceServer
	r *recorder
}

func (f fakeNetworks) ListNetworks(_ context.Context, req *poolv1.ListNetworksRequest) (*poolv1.ListNetworksResponse, error) {
	if err := f.r.record("ListNetworks", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	resp := &poolv1.ListNetworksResponse{}
	for _, n := range f.r.networks {
		resp.Networks = append(resp.Networks, n)
	}
	return resp, nil
}

func (f fakeNetworks) GetNetwork(_ context.Context, req *poolv1.GetNetworkRequest) (*poolv1.Network, error) {
	if err := f.r.record("GetNetwork", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	if n, ok := f.r.networks[req.GetName()]; ok {
		return n, nil
	}
	return nil, notFound()
}

func (f fakeNetworks) ApplyNetwork(_ context.Context, req *poolv1.ApplyNetworkRequest) (*poolv1.Network, error) {
	if err := f.r.record("ApplyNetwork", req); err != nil {
		return nil, err
	}
	return &poolv1.Network{Name: req.GetName()}, nil
}

func (f fakeNetworks) DeleteNetwork(_ context.Context, req *poolv1.DeleteNetworkRequest) (*emptypb.Empty, error) {
	if err := f.r.record("DeleteNetwork", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (f fakeNetworks) ReserveNetworkInterface(_ context.Context, req *poolv1.ReserveNetworkInterfaceRequest) (*poolv1.Network, error) {
	if err := f.r.record("ReserveNetworkInterface", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	n, ok := f.r.networks[req.GetNetworkName()]
	if !ok {
		return nil, notFound()
	}
	n = proto.Clone(n).(*poolv1.Network)
	if n.ReservedNetworkInterfaces == nil {
		n.ReservedNetworkInterfaces = map[string]*poolv1.NetworkInterface{}
	}
	n.ReservedNetworkInterfaces[req.GetNetworkInterfaceName()] = &poolv1.NetworkInterface{
		HardwareAddress: req.GetHardwareAddress(),
		Ipv4Address:     req.GetIpv4Address(),
		Ipv6Address:     req.GetIpv6Address(),
	}
	return n, nil
}

func (f fakeNetworks) ReleaseNetworkInterface(_ context.Context, req *poolv1.ReleaseNetworkInterfaceRequest) (*emptypb.Empty, error) {
	if err := f.r.record("ReleaseNetworkInterface", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

type fakeBlockStorages struct {
	provisioningv1.UnimplementedBlockStorageServiceServer
	r *recorder
}

func (f fakeBlockStorages) ListBlockStorages(_ context.Context, req *provisioningv1.ListBlockStoragesRequest) (*provisioningv1.ListBlockStoragesResponse, error) {
	if err := f.r.record("ListBlockStorages", req); err != nil {
		return nil, err
	}
	return &provisioningv1.ListBlockStoragesResponse{BlockStorages: []*provisioningv1.BlockStorage{{
		Name: "disk1", State: provisioningv1.BlockStorage_IN_USE, NodeName: "n1",
		RequestBytes: 10 << 30, LimitBytes: 20 << 30,
	}}}, nil
}

func (f fakeBlockStorages) CreateBlockStorage(_ context.Context, req *provisioningv1.CreateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("CreateBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetName()}, nil
}

func (f fakeBlockStorages) FetchBlockStorage(_ context.Context, req *provisioningv1.FetchBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("FetchBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetName()}, nil
}

func (f fakeBlockStorages) DeleteBlockStorage(_ context.Context, req *provisioningv1.DeleteBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	if err := f.r.record("DeleteBlockStorage", req); err != nil {
		return nil, err
	}
	return &provisioningv1.BlockStorage{Name: req.GetName(), State: provisioningv1.BlockStorage_DELETED}, nil
}

type fakeVMs struct {
	provisioningv1.UnimplementedVirtualMachineServiceServer
	r *recorder
}

func (f fakeVMs) ListVirtualMachines(_ context.Context, req *provisioningv1.ListVirtualMachinesRequest) (*provisioningv1.ListVirtualMachinesResponse, error) {
	if err := f.r.record("ListVirtualMachines", req); err != nil {
		return nil, err
	}
	return &provisioningv1.ListVirtualMachinesResponse{VirtualMachines: []*provisioningv1.VirtualMachine{{
		Name: "vm1", State: provisioningv1.VirtualMachine_RUNNING, ComputeNodeName: "n1",
		LimitCpuMilliCore: 2000, LimitMemoryBytes: 4 << 30, BlockStorageNames: []string{"disk1"},
		Nics: []*provisioningv1.VirtualMachineNIC{{NetworkName: "lan", Ipv4Address: "192.168.0.10"}},
	}}}, nil
}

func (f fakeVMs) CreateVirtualMachine(_ context.Context, req *provisioningv1.CreateVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	if err := f.r.record("CreateVirtualMachine", req); err != nil {
		return nil, err
	}
	return &provisioningv1.VirtualMachine{Name: req.GetName()}, nil
}

type fakeImages struct {
	deploymentv1.UnimplementedImageServiceServer
	r *recorder
}

func (f fakeImages) ListImages(_ context.Context, req *deploymentv1.ListImagesRequest) (*deploymentv1.ListImagesResponse, error) {
	if err := f.r.record("ListImages", req); err != nil {
		return nil, err
	}
	return &deploymentv1.ListImagesResponse{Images: []*deploymentv1.Image{{
		Name:                    "debian",
		RegisteredBlockStorages: []*deploymentv1.Image_RegisteredBlockStorage{{BlockStorageName: "debian-12"}},
		Tags:                    map[string]string{"latest": "debian-12"},
	}}}, nil
}

func (f fakeImages) ApplyImage(_ context.Context, req *deploymentv1.ApplyImageRequest) (*deploymentv1.Image, error) {
	if err := f.r.record("ApplyImage", req); err != nil {
		return nil, err
	}
	return &deploymentv1.Image{Name: req.GetName()}, nil
}

type fakeMachines struct {
	inventoryv1.UnimplementedMachineServiceServer
	r *recorder
}

func (f fakeMachines) ListMachines(_ context.Context, req *inventoryv1.ListMachinesRequest) (*inventoryv1.ListMachinesResponse, error) {
	if err := f.r.record("ListMachines", req); err != nil {
		return nil, err
	}
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	resp := &inventoryv1.ListMachinesResponse{}
	for _, m := range f.r.machines {
		resp.Machines = append(resp.Machines, m)
	}
	return resp, nil
}

func (f fakeMachines) AcceptMachine(_ context.Context, req *inventoryv1.AcceptMachineRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("AcceptMachine", req); err != nil {
		return nil, err
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: inventoryv1.Machine_INSTALLING,
		Install: &inventoryv1.Install{InstallId: "i1", Disk: req.GetDisk(), Wipe: req.GetWipe()}}, nil
}

func (f fakeMachines) ReprovisionMachine(_ context.Context, req *inventoryv1.ReprovisionMachineRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("ReprovisionMachine", req); err != nil {
		return nil, err
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: inventoryv1.Machine_DISCOVERED,
		StateReason: "reprovisioning: no BMC enrolled: reboot the machine into network boot", Wipe: &inventoryv1.PendingWipe{Disk: "/dev/vdb"}}, nil
}

func (f fakeMachines) SetMaintenance(_ context.Context, req *inventoryv1.SetMaintenanceRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("SetMaintenance", req); err != nil {
		return nil, err
	}
	st := inventoryv1.Machine_INVENTORIED
	if req.GetOn() {
		st = inventoryv1.Machine_MAINTENANCE
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: st, StateReason: req.GetReason()}, nil
}

func (f fakeMachines) LabelMachine(_ context.Context, req *inventoryv1.LabelMachineRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("LabelMachine", req); err != nil {
		return nil, err
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: inventoryv1.Machine_READY, Labels: req.GetSet()}, nil
}

func (f fakeMachines) AllocateMachines(_ context.Context, req *inventoryv1.AllocateMachinesRequest) (*inventoryv1.AllocateMachinesResponse, error) {
	if err := f.r.record("AllocateMachines", req); err != nil {
		return nil, err
	}
	resp := &inventoryv1.AllocateMachinesResponse{}
	for k := range max(req.GetCount(), 1) {
		resp.Machines = append(resp.Machines, &inventoryv1.Machine{Name: fmt.Sprintf("m%d", k+1), State: inventoryv1.Machine_ALLOCATED,
			Allocation: &inventoryv1.Allocation{Owner: "token:ab12", OwnerName: "ci"}})
	}
	return resp, nil
}

func (f fakeMachines) ReleaseMachine(_ context.Context, req *inventoryv1.ReleaseMachineRequest) (*inventoryv1.Machine, error) {
	if err := f.r.record("ReleaseMachine", req); err != nil {
		return nil, err
	}
	return &inventoryv1.Machine{Name: req.GetName(), State: inventoryv1.Machine_READY, StateReason: "released by its owner"}, nil
}

// testServer is a bufconn gRPC server running every fake.
type testServer struct {
	*recorder
	lis *bufconn.Listener

	mu     sync.Mutex
	dialed []clientconfig.Config // configurations the CLI dialled with
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	r := &recorder{
		nodes:    map[string]*poolv1.Node{},
		networks: map[string]*poolv1.Network{},
		machines: map[string]*inventoryv1.Machine{},
		fail:     map[string]error{},
		streams:  map[string][]streamStep{},
		opened:   make(chan string, 64),
	}
	srv := grpc.NewServer()
	poolv1.RegisterNodeServiceServer(srv, fakeNodes{r: r})
	poolv1.RegisterNetworkServiceServer(srv, fakeNetworks{r: r})
	provisioningv1.RegisterBlockStorageServiceServer(srv, fakeBlockStorages{r: r})
	provisioningv1.RegisterVirtualMachineServiceServer(srv, fakeVMs{r: r})
	deploymentv1.RegisterImageServiceServer(srv, fakeImages{r: r})
	inventoryv1.RegisterMachineServiceServer(srv, fakeMachines{r: r})
	auditv1.RegisterAuditServiceServer(srv, fakeAudit{r: r})
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

// dial is an App.Dial that reaches the bufconn server whatever the
// endpoint, recording the configuration it was given.
func (s *testServer) dial(cfg *clientconfig.Config) (*grpc.ClientConn, error) {
	s.mu.Lock()
	s.dialed = append(s.dialed, *cfg)
	s.mu.Unlock()
	return grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
}

// result is what one CLI run produced.
type result struct {
	code   int
	stdout string
	stderr string
}

// run runs the CLI against s with stdin and env (HOME defaults to an empty
// temporary directory) and a fixed --endpoint unless noEndpoint.
func (s *testServer) run(t *testing.T, stdin string, env map[string]string, args ...string) result {
	t.Helper()
	if env == nil {
		env = map[string]string{}
	}
	if _, ok := env["HOME"]; !ok {
		env["HOME"] = t.TempDir()
	}
	if _, ok := env[envEndpoint]; !ok {
		env[envEndpoint] = "bufnet:1"
	}
	var stdout, stderr bytes.Buffer
	app := &App{
		Stdin:  strings.NewReader(stdin),
		Stdout: &stdout,
		Stderr: &stderr,
		Getenv: func(k string) string { return env[k] },
		Dial:   s.dial,
	}
	code := app.Run(context.Background(), args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// start runs the CLI against s in the background until ctx ends (a watch),
// writing into stdout and stderr; wait returns its exit code.
func (s *testServer) start(ctx context.Context, t *testing.T, stdout, stderr io.Writer, args ...string) (wait func() int) {
	t.Helper()
	env := map[string]string{"HOME": t.TempDir(), envEndpoint: "bufnet:1"}
	app := &App{
		Stdout: stdout,
		Stderr: stderr,
		Getenv: func(k string) string { return env[k] },
		Dial:   s.dial,
	}
	done := make(chan int, 1)
	go func() { done <- app.Run(ctx, args) }()
	return func() int { return <-done }
}
