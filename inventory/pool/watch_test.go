package pool

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// TestWatchNodesNetworks: over gRPC on a bbolt store, the watches list,
// send SYNCED, follow Apply and Delete live, resume, and refuse a
// compacted revision with OUT_OF_RANGE.
func TestWatchNodesNetworks(t *testing.T) {
	e := newBoltEnv(t)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Register(srv, e.p)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	nodes := poolv1.NewNodeServiceClient(conn)
	nets := poolv1.NewNetworkServiceClient(conn)
	ctx := t.Context()

	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "hv1", CpuMilliCores: 2000, MemoryBytes: 2 * gib, StorageBytes: 10 * gib}); err != nil {
		t.Fatal(err)
	}
	if _, err := nets.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "n1", Ipv4Cidr: "10.0.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	nw, err := nodes.WatchNodes(ctx, &poolv1.WatchNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	netw, err := nets.WatchNetworks(ctx, &poolv1.WatchNetworksRequest{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	node := func() string {
		ev, err := nw.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(fmt.Sprintf("%s %s %d", ev.GetType(), ev.GetNode().GetName(), ev.GetNode().GetCpuMilliCores()))
	}
	var synced int64
	network := func() string {
		ev, err := netw.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetType().String() == "SYNCED" {
			synced = ev.GetRevision()
		}
		return strings.TrimSpace(fmt.Sprintf("%s %s %s", ev.GetType(), ev.GetNetwork().GetName(), ev.GetNetwork().GetIpv4Cidr()))
	}
	var got []string
	for range 2 {
		got = append(got, node())
	}
	for range 2 {
		got = append(got, network())
	}
	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "hv1", CpuMilliCores: 4000, MemoryBytes: 2 * gib, StorageBytes: 10 * gib}); err != nil {
		t.Fatal(err)
	}
	if _, err := nets.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "n10", Ipv4Cidr: "10.1.0.0/24"}); err != nil {
		t.Fatal(err) // extends n1's name: not in n1's watch
	}
	if _, err := nets.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: "hv1"}); err != nil {
		t.Fatal(err)
	}
	got = append(got, node(), node(), network())
	want := []string{"ADDED hv1 2000", "SYNCED  0", "ADDED n1 10.0.0.0/24", "SYNCED", "MODIFIED hv1 4000", "DELETED hv1 0", "DELETED n1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	res, err := nets.WatchNetworks(ctx, &poolv1.WatchNetworksRequest{FromRevision: synced})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := res.Recv()
	if err != nil || ev.GetNetwork().GetName() != "n10" {
		t.Fatalf("resumed: %v, %v; want n10", ev, err)
	}
	bad, err := nodes.WatchNodes(ctx, &poolv1.WatchNodesRequest{FromRevision: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("future revision: %v, want OutOfRange", err)
	}
}
