// Package fakenode is an in-memory HypervisorService for tests of the
// appliance side: it keeps volumes, VMs and networks in maps, records every
// call, and can be told to fail a method or to become unreachable. Nodes
// are served over bufconn; Dialer maps node names to them and implements
// appliance.NodeDialer.
//
// It imports the generated API and gRPC only. It is not for production.
package fakenode

import (
	"context"
	"fmt"
	"net"
	"path"
	"sort"
	"strings"
	"sync"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Call is one recorded RPC: the short method name and a copy of the
// request.
type Call struct {
	Method  string
	Request proto.Message
}

// Node is one fake hypervisor node. All methods are safe for concurrent
// use.
type Node struct {
	hypervisorv1.UnimplementedHypervisorServiceServer
	Name string

	mu       sync.Mutex
	volumes  map[string]*hypervisorv1.Volume
	vms      map[string]*hypervisorv1.VM
	networks map[string]*hypervisorv1.ApplyNetworkRequest
	calls    []Call
	fail     map[string]error
	vanish   map[string]bool
	down     bool
	fetch    func(*hypervisorv1.FetchVolumeRequest) error

	lis  *bufconn.Listener
	srv  *grpc.Server
	conn *grpc.ClientConn
}

// Start serves a new fake node over bufconn.
func Start(name string) (*Node, error) {
	n := &Node{
		Name:     name,
		volumes:  map[string]*hypervisorv1.Volume{},
		vms:      map[string]*hypervisorv1.VM{},
		networks: map[string]*hypervisorv1.ApplyNetworkRequest{},
		fail:     map[string]error{},
		vanish:   map[string]bool{},
		lis:      bufconn.Listen(1 << 20),
	}
	n.srv = grpc.NewServer(grpc.UnaryInterceptor(n.intercept))
	hypervisorv1.RegisterHypervisorServiceServer(n.srv, n)
	go func() { _ = n.srv.Serve(n.lis) }()
	conn, err := grpc.NewClient("passthrough:///"+name,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return n.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		n.srv.Stop()
		return nil, err
	}
	n.conn = conn
	return n, nil
}

// Close stops the server and closes the client connection.
func (n *Node) Close() {
	_ = n.conn.Close()
	n.srv.Stop()
}

// Client returns a client of this node.
func (n *Node) Client() hypervisorv1.HypervisorServiceClient {
	return hypervisorv1.NewHypervisorServiceClient(n.conn)
}

func (n *Node) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method := path.Base(info.FullMethod)
	n.mu.Lock()
	n.calls = append(n.calls, Call{Method: method, Request: proto.Clone(req.(proto.Message))})
	down, err, vanish := n.down, n.fail[method], n.vanish[method]
	n.mu.Unlock()
	if down {
		return nil, status.Errorf(codes.Unavailable, "connection refused (fake node %s is down)", n.Name)
	}
	if err != nil {
		return nil, err
	}
	resp, err := h(ctx, req)
	if vanish {
		n.SetDown(true)
		return nil, status.Errorf(codes.Unavailable, "connection reset (fake node %s vanished during %s)", n.Name, method)
	}
	return resp, err
}

// VanishAfter makes the next call of method run and then take the node
// down before answering (the caller sees Unavailable): a node that dies
// mid-operation. SetDown(false) brings it back.
func (n *Node) VanishAfter(method string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.vanish[method] = true
}

// FailOn makes every call of method (e.g. "BootVM") return err; a nil err
// clears it.
func (n *Node) FailOn(method string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil {
		delete(n.fail, method)
		return
	}
	n.fail[method] = err
}

// SetDown makes the node unreachable (every call Unavailable) or back.
func (n *Node) SetDown(down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = down
	if !down {
		clear(n.vanish)
	}
}

// OnFetch sets a hook that may refuse a FetchVolume (return a status
// error, e.g. NotFound for an HTTP 404).
func (n *Node) OnFetch(f func(*hypervisorv1.FetchVolumeRequest) error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fetch = f
}

// KillVM removes a VM as if its QEMU died.
func (n *Node) KillVM(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.vms, name)
}

// Calls returns the recorded calls.
func (n *Node) Calls() []Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Call(nil), n.calls...)
}

// Methods returns the recorded method names, in order.
func (n *Node) Methods() []string {
	var out []string
	for _, c := range n.Calls() {
		out = append(out, c.Method)
	}
	return out
}

// Volumes returns the volume names, sorted.
func (n *Node) Volumes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return sortedKeys(n.volumes)
}

// Volume returns a copy of one volume, or nil.
func (n *Node) Volume(name string) *hypervisorv1.Volume {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.volumes[name]; ok {
		return proto.CloneOf(v)
	}
	return nil
}

// VMs returns the VM names, sorted.
func (n *Node) VMs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return sortedKeys(n.vms)
}

// VM returns a copy of one VM, or nil.
func (n *Node) VM(name string) *hypervisorv1.VM {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.vms[name]; ok {
		return proto.CloneOf(v)
	}
	return nil
}

// Networks returns the applied network names, sorted.
func (n *Node) Networks() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return sortedKeys(n.networks)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func volumePath(name string) string { return "/var/lib/corral/volumes/" + name + ".qcow2" }

// CreateVolume records a qcow2 volume (on a backing volume when asked):
// AlreadyExists for a taken name, NotFound for a missing backing volume.
func (n *Node) CreateVolume(_ context.Context, req *hypervisorv1.CreateVolumeRequest) (*hypervisorv1.Volume, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.volumes[req.GetName()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "volume %q exists", req.GetName())
	}
	v := &hypervisorv1.Volume{Name: req.GetName(), Path: volumePath(req.GetName()), SizeBytes: req.GetSizeBytes(), Format: "qcow2"}
	if b := req.GetBackingVolume(); b != "" {
		bv, ok := n.volumes[b]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "backing volume %q not found", b)
		}
		v.BackingFile = bv.GetPath()
	}
	n.volumes[v.Name] = v
	return proto.CloneOf(v), nil
}

// FetchVolume runs the OnFetch hook, then records the volume as if
// fetched: AlreadyExists for a taken name.
func (n *Node) FetchVolume(_ context.Context, req *hypervisorv1.FetchVolumeRequest) (*hypervisorv1.Volume, error) {
	n.mu.Lock()
	f := n.fetch
	n.mu.Unlock()
	if f != nil {
		if err := f(req); err != nil {
			return nil, err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.volumes[req.GetName()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "volume %q exists", req.GetName())
	}
	v := &hypervisorv1.Volume{Name: req.GetName(), Path: volumePath(req.GetName()), SizeBytes: req.GetSizeBytes(), Format: "qcow2"}
	n.volumes[v.Name] = v
	return proto.CloneOf(v), nil
}

// ResizeVolume grows a volume: NotFound, or InvalidArgument for a shrink.
func (n *Node) ResizeVolume(_ context.Context, req *hypervisorv1.ResizeVolumeRequest) (*hypervisorv1.Volume, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.volumes[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetName())
	}
	if req.GetSizeBytes() < v.GetSizeBytes() {
		return nil, status.Errorf(codes.InvalidArgument, "shrinking %q refused", req.GetName())
	}
	v.SizeBytes = req.GetSizeBytes()
	return proto.CloneOf(v), nil
}

// GetVolume returns a copy of the volume, or NotFound.
func (n *Node) GetVolume(_ context.Context, req *hypervisorv1.VolumeRequest) (*hypervisorv1.Volume, error) {
	if v := n.Volume(req.GetName()); v != nil {
		return v, nil
	}
	return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetName())
}

// DeleteVolume removes a volume: NotFound, or FailedPrecondition while it
// backs another.
func (n *Node) DeleteVolume(_ context.Context, req *hypervisorv1.VolumeRequest) (*emptypb.Empty, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.volumes[req.GetName()]; !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetName())
	}
	for _, v := range n.volumes {
		if v.GetBackingFile() == volumePath(req.GetName()) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q backs %q", req.GetName(), v.GetName())
		}
	}
	delete(n.volumes, req.GetName())
	return &emptypb.Empty{}, nil
}

// ListVolumes returns copies of the volumes by name.
func (n *Node) ListVolumes(context.Context, *hypervisorv1.ListVolumesRequest) (*hypervisorv1.ListVolumesResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := &hypervisorv1.ListVolumesResponse{}
	for _, k := range sortedKeys(n.volumes) {
		out.Volumes = append(out.Volumes, proto.CloneOf(n.volumes[k]))
	}
	return out, nil
}

// BootVM starts a VM, or marks an existing one RUNNING: NotFound for a
// missing disk volume, FailedPrecondition for a network not applied.
func (n *Node) BootVM(_ context.Context, req *hypervisorv1.BootVMRequest) (*hypervisorv1.VM, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	spec := req.GetVm()
	if v, ok := n.vms[spec.GetName()]; ok {
		v.State = hypervisorv1.VMState_VM_STATE_RUNNING
		return proto.CloneOf(v), nil
	}
	for _, d := range spec.GetDisks() {
		if _, ok := n.volumes[d.GetVolume()]; !ok {
			return nil, status.Errorf(codes.NotFound, "disk volume %q not found", d.GetVolume())
		}
	}
	for _, nic := range spec.GetNics() {
		if _, ok := n.networks[nic.GetNetworkName()]; !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "network %q not applied", nic.GetNetworkName())
		}
	}
	v := proto.CloneOf(spec)
	v.State = hypervisorv1.VMState_VM_STATE_RUNNING
	v.Console = "vnc+unix:///run/corral/vms/" + v.GetName() + "/vnc.sock"
	n.vms[v.GetName()] = v
	return proto.CloneOf(v), nil
}

func (n *Node) vmOp(name string, f func(*hypervisorv1.VM)) (*hypervisorv1.VM, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.vms[name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "vm %q not found", name)
	}
	f(v)
	return proto.CloneOf(v), nil
}

// RebootVM marks the VM RUNNING, or NotFound.
func (n *Node) RebootVM(_ context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	return n.vmOp(req.GetName(), func(v *hypervisorv1.VM) { v.State = hypervisorv1.VMState_VM_STATE_RUNNING })
}

// ShutdownVM marks the VM SHUTDOWN, or NotFound.
func (n *Node) ShutdownVM(_ context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	return n.vmOp(req.GetName(), func(v *hypervisorv1.VM) { v.State = hypervisorv1.VMState_VM_STATE_SHUTDOWN })
}

// GetVM returns a copy of the VM, or NotFound.
func (n *Node) GetVM(_ context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	return n.vmOp(req.GetName(), func(*hypervisorv1.VM) {})
}

// DeleteVM forgets the VM, or NotFound.
func (n *Node) DeleteVM(_ context.Context, req *hypervisorv1.VMRequest) (*emptypb.Empty, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.vms[req.GetName()]; !ok {
		return nil, status.Errorf(codes.NotFound, "vm %q not found", req.GetName())
	}
	delete(n.vms, req.GetName())
	return &emptypb.Empty{}, nil
}

// ListVMs returns copies of the VMs by name.
func (n *Node) ListVMs(context.Context, *hypervisorv1.ListVMsRequest) (*hypervisorv1.ListVMsResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := &hypervisorv1.ListVMsResponse{}
	for _, k := range sortedKeys(n.vms) {
		out.Vms = append(out.Vms, proto.CloneOf(n.vms[k]))
	}
	return out, nil
}

// ApplyNetwork records the network (replacing one of that name).
func (n *Node) ApplyNetwork(_ context.Context, req *hypervisorv1.ApplyNetworkRequest) (*emptypb.Empty, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.networks[req.GetName()] = proto.CloneOf(req)
	return &emptypb.Empty{}, nil
}

// DeleteNetwork forgets the network; an unknown one is no error.
func (n *Node) DeleteNetwork(_ context.Context, req *hypervisorv1.DeleteNetworkRequest) (*emptypb.Empty, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.networks, req.GetName())
	return &emptypb.Empty{}, nil
}

// Dialer maps node names to fake nodes; it implements
// appliance.NodeDialer. Unknown names fail like an unreachable host.
type Dialer struct {
	mu    sync.Mutex
	nodes map[string]*Node
}

// Add registers n under n.Name.
func (d *Dialer) Add(n *Node) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nodes == nil {
		d.nodes = map[string]*Node{}
	}
	d.nodes[n.Name] = n
}

// Hypervisor returns the client of the named fake node.
func (d *Dialer) Hypervisor(_ context.Context, name string) (hypervisorv1.HypervisorServiceClient, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, ok := d.nodes[name]
	if !ok {
		return nil, fmt.Errorf("dial %s: no route to host", strings.TrimSpace(name))
	}
	return n.Client(), nil
}
