package deploy_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/deploy"
	apptest "github.com/corralhq/corral/testsupport/appliance"
)

// startCorrald runs a real appliance (bbolt, TLS, tokens) on a loopback
// port and returns an admin client configuration for it.
func startCorrald(t *testing.T) *clientconfig.Config {
	t.Helper()
	a := apptest.Start(t, appliance.Config{Logger: slog.New(slog.DiscardHandler)})
	cc, err := clientconfig.Load(a.AdminConf)
	if err != nil {
		t.Fatalf("admin.conf: %v", err)
	}
	return cc
}

// poolDAG exercises the real pool services: a node and a network, two
// compute and two address reservations made in parallel, one of each
// released again, and an idempotent delete of something absent.
const poolDAG = `
Delete_old-network:
  type: Network
  action: DeleteNetwork
  args: {name: old}
  ignore_error: true
ApplyNode:
  type: Node
  action: ApplyNode
  args:
    name: n1
    address: 10.1.0.11
    cpu_milli_cores: 8000
    memory_bytes: 17179869184
    storage_bytes: 107374182400
    rack: r1
ApplyNetwork:
  type: Network
  action: ApplyNetwork
  args:
    name: lan
    ipv4_cidr: 10.0.0.0/24
    ipv4_gateway: 10.0.0.1
    dns_servers: [10.0.0.1]
  depends_on: [Delete_old-network]
ReserveCompute_vm1:
  type: Node
  action: ReserveCompute
  args:
    node_name: n1
    compute_name: vm1
    request_cpu_milli_core: 1000
    limit_cpu_milli_core: 2000
    request_memory_bytes: 1073741824
    limit_memory_bytes: 1073741824
  depends_on: [ApplyNode]
ReserveCompute_vm2:
  type: Node
  action: ReserveCompute
  args:
    node_name: n1
    compute_name: vm2
    request_cpu_milli_core: 500
    limit_cpu_milli_core: 1000
    request_memory_bytes: 536870912
    limit_memory_bytes: 536870912
  depends_on: [ApplyNode]
ReserveNetworkInterface_vm1:
  type: Network
  action: ReserveNetworkInterface
  args:
    network_name: lan
    network_interface_name: vm1-eth0
    hardware_address: "52:54:00:00:00:01"
    ipv4_address: 10.0.0.5
  depends_on: [ApplyNetwork]
ReserveNetworkInterface_vm2:
  type: Network
  action: ReserveNetworkInterface
  args:
    network_name: lan
    network_interface_name: vm2-eth0
    hardware_address: "52:54:00:00:00:02"
    ipv4_address: 10.0.0.6
  depends_on: [ApplyNetwork]
ReleaseCompute_vm2:
  type: Node
  action: ReleaseCompute
  args: {node_name: n1, compute_name: vm2}
  depends_on: [ReserveCompute_vm2, ReserveNetworkInterface_vm2]
ReleaseNetworkInterface_vm2:
  type: Network
  action: ReleaseNetworkInterface
  args: {network_name: lan, network_interface_name: vm2-eth0}
  depends_on: [ReleaseCompute_vm2]
`

func TestDoAgainstCorrald(t *testing.T) {
	if testing.Short() {
		t.Skip("starts corrald")
	}
	cfg := startCorrald(t)
	conn, err := clientconfig.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	plan, err := deploy.Parse([]byte(poolDAG))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &deploy.Runner{Conn: conn, Parallel: 3, TaskTimeout: 10 * time.Second}
	s, err := r.Run(ctx, plan)
	if err != nil {
		for _, res := range s.Results {
			t.Logf("%s: %s %v %s", res.Task.Name, res.Outcome, res.Err, res.Reason)
		}
		t.Fatal(err)
	}
	if s.Succeeded != 8 || s.Ignored != 1 {
		t.Errorf("summary: %d succeeded, %d ignored, %d failed, %d skipped", s.Succeeded, s.Ignored, s.Failed, s.Skipped)
	}
	if res := s.Results[0]; res.Task.Name != "Delete_old-network" || status.Code(res.Err) != codes.NotFound {
		t.Errorf("first result %s: %v", res.Task.Name, res.Err)
	}

	node, err := poolv1.NewNodeServiceClient(conn).GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]*poolv1.Compute{"vm1": {
		RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000,
		RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30,
	}}, node.GetReservedComputes(), protocmp.Transform()); diff != "" {
		t.Errorf("node computes (-want +got):\n%s", diff)
	}
	if node.GetState() != poolv1.Node_READY || node.GetRack() != "r1" || node.GetCpuMilliCores() != 8000 {
		t.Errorf("node %v", node)
	}
	network, err := poolv1.NewNetworkServiceClient(conn).GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	nics := network.GetReservedNetworkInterfaces()
	if len(nics) != 1 || nics["vm1-eth0"].GetIpv4Address() != "10.0.0.5" || nics["vm1-eth0"].GetHardwareAddress() != "52:54:00:00:00:01" {
		t.Errorf("network interfaces %v", nics)
	}

	// Running the same file again, one task at a time: the applies are
	// idempotent, vm1's compute is still reserved, so the run stops there
	// and everything after it is skipped.
	r.Parallel = 1
	s, err = r.Run(ctx, plan)
	if !errors.Is(err, deploy.ErrTaskFailed) {
		t.Fatalf("second run: %v", err)
	}
	got := map[string]string{}
	for _, res := range s.Results {
		got[res.Task.Name] = res.Outcome.String()
		if res.Outcome == deploy.Failed {
			got[res.Task.Name] += " " + status.Code(res.Err).String()
		}
	}
	want := map[string]string{
		"Delete_old-network":          "ignored failure",
		"ApplyNode":                   "succeeded",
		"ApplyNetwork":                "succeeded",
		"ReserveCompute_vm1":          "failed AlreadyExists",
		"ReserveCompute_vm2":          "skipped",
		"ReserveNetworkInterface_vm1": "skipped",
		"ReserveNetworkInterface_vm2": "skipped",
		"ReleaseCompute_vm2":          "skipped",
		"ReleaseNetworkInterface_vm2": "skipped",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("second run (-want +got):\n%s", diff)
	}
}
