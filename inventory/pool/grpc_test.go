package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestToStatus(t *testing.T) {
	tests := map[string]struct {
		err  error
		want codes.Code
	}{
		"nil":               {err: nil, want: codes.OK},
		"invalid":           {err: invalidf("x"), want: codes.InvalidArgument},
		"not found":         {err: notFoundf("x"), want: codes.NotFound},
		"store not found":   {err: fmt.Errorf("get: %w", store.ErrNotFound), want: codes.NotFound},
		"already exists":    {err: existsf("x"), want: codes.AlreadyExists},
		"exhausted":         {err: exhaustedf("x"), want: codes.ResourceExhausted},
		"precondition":      {err: preconditionf("x"), want: codes.FailedPrecondition},
		"wrapped exhausted": {err: fmt.Errorf("schedule: %w", exhaustedf("x")), want: codes.ResourceExhausted},
		"deadline":          {err: context.DeadlineExceeded, want: codes.DeadlineExceeded},
		"canceled":          {err: context.Canceled, want: codes.Canceled},
		"closed":            {err: store.ErrClosed, want: codes.Unavailable},
		"corrupt":           {err: fmt.Errorf("k: %w", store.ErrCorrupt), want: codes.DataLoss},
		"schema":            {err: record.ErrSchema, want: codes.DataLoss},
		"conflict":          {err: store.ErrConflict, want: codes.Internal},
		"other":             {err: errors.New("boom"), want: codes.Internal},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := toStatus(tc.err)
			if tc.err == nil {
				if got != nil {
					t.Fatalf("toStatus(nil) = %v", got)
				}
				return
			}
			s, ok := status.FromError(got)
			if !ok || s.Code() != tc.want {
				t.Fatalf("toStatus(%v) = %v, want code %v", tc.err, got, tc.want)
			}
			if s.Message() != tc.err.Error() {
				t.Errorf("message = %q, want %q", s.Message(), tc.err.Error())
			}
		})
	}
}

// TestGRPC runs the services over bufconn: the wire layer maps fields and
// errors the way the Pool methods do.
func TestGRPC(t *testing.T) {
	e := newEnv(t)
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

	code := status.Code

	// Empty lists are empty, not NotFound (unlike n0stack).
	ln, err := nodes.ListNodes(ctx, &poolv1.ListNodesRequest{})
	if err != nil || len(ln.GetNodes()) != 0 {
		t.Fatalf("ListNodes = %v, %v", ln, err)
	}
	lw, err := nets.ListNetworks(ctx, &poolv1.ListNetworksRequest{})
	if err != nil || len(lw.GetNetworks()) != 0 {
		t.Fatalf("ListNetworks = %v, %v", lw, err)
	}

	steps := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"get missing node", func() error { _, err := nodes.GetNode(ctx, &poolv1.GetNodeRequest{Name: "hv1"}); return err }, codes.NotFound},
		{"apply bad node", func() error { _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "a/b"}); return err }, codes.InvalidArgument},
		{"apply node", func() error {
			_, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "hv1", CpuMilliCores: 2000, MemoryBytes: 2 * gib, StorageBytes: 10 * gib})
			return err
		}, codes.OK},
		{"schedule compute", func() error {
			n, err := nodes.ScheduleCompute(ctx, &poolv1.ScheduleComputeRequest{ComputeName: "vm1", Annotations: map[string]string{"k": "v"}, RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000, RequestMemoryBytes: gib, LimitMemoryBytes: gib})
			if err == nil {
				want := &poolv1.Compute{Annotations: map[string]string{"k": "v"}, RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000, RequestMemoryBytes: gib, LimitMemoryBytes: gib}
				if diff := cmp.Diff(want, n.GetReservedComputes()["vm1"], protocmp.Transform()); diff != "" {
					t.Errorf("scheduled compute (-want +got):\n%s", diff)
				}
			}
			return err
		}, codes.OK},
		{"reserve compute", func() error {
			_, err := nodes.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: "hv1", ComputeName: "vm2", RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: gib, LimitMemoryBytes: gib})
			return err
		}, codes.OK},
		{"reserve compute exhausted", func() error {
			_, err := nodes.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: "hv1", ComputeName: "vm3", RequestCpuMilliCore: 1, LimitCpuMilliCore: 1, RequestMemoryBytes: 1, LimitMemoryBytes: 1})
			return err
		}, codes.ResourceExhausted},
		{"reserve compute duplicate", func() error {
			_, err := nodes.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: "hv1", ComputeName: "vm2", RequestCpuMilliCore: 1, LimitCpuMilliCore: 1, RequestMemoryBytes: 1, LimitMemoryBytes: 1})
			return err
		}, codes.AlreadyExists},
		{"schedule storage", func() error {
			_, err := nodes.ScheduleStorage(ctx, &poolv1.ScheduleStorageRequest{StorageName: "vol1", RequestBytes: gib, LimitBytes: gib})
			return err
		}, codes.OK},
		{"reserve storage", func() error {
			_, err := nodes.ReserveStorage(ctx, &poolv1.ReserveStorageRequest{NodeName: "hv1", StorageName: "vol2", RequestBytes: gib, LimitBytes: gib})
			return err
		}, codes.OK},
		{"delete held node", func() error { _, err := nodes.DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: "hv1"}); return err }, codes.FailedPrecondition},
		{"release compute", func() error {
			_, err := nodes.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: "hv1", ComputeName: "vm1"})
			return err
		}, codes.OK},
		{"release compute again", func() error {
			_, err := nodes.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: "hv1", ComputeName: "vm1"})
			return err
		}, codes.NotFound},
		{"release the rest", func() error {
			for _, err := range []error{
				func() error {
					_, err := nodes.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: "hv1", ComputeName: "vm2"})
					return err
				}(),
				func() error {
					_, err := nodes.ReleaseStorage(ctx, &poolv1.ReleaseStorageRequest{NodeName: "hv1", StorageName: "vol1"})
					return err
				}(),
				func() error {
					_, err := nodes.ReleaseStorage(ctx, &poolv1.ReleaseStorageRequest{NodeName: "hv1", StorageName: "vol2"})
					return err
				}(),
			} {
				if err != nil {
					return err
				}
			}
			return nil
		}, codes.OK},
		{"delete node", func() error { _, err := nodes.DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: "hv1"}); return err }, codes.OK},
		{"apply network", func() error {
			_, err := nets.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/30"})
			return err
		}, codes.OK},
		{"apply overlapping network", func() error {
			_, err := nets.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "lan2", Ipv4Cidr: "10.0.0.0/24"})
			return err
		}, codes.FailedPrecondition},
		{"get network", func() error { _, err := nets.GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "lan"}); return err }, codes.OK},
		{"reserve nic", func() error {
			n, err := nets.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "a", Ipv4Address: "10.0.0.2", HardwareAddress: "02:00:00:00:00:01"})
			if err == nil {
				want := &poolv1.NetworkInterface{Ipv4Address: "10.0.0.2", HardwareAddress: "02:00:00:00:00:01"}
				if diff := cmp.Diff(want, n.GetReservedNetworkInterfaces()["a"], protocmp.Transform()); diff != "" {
					t.Errorf("nic (-want +got):\n%s", diff)
				}
			}
			return err
		}, codes.OK},
		{"reserve nic auto", func() error {
			_, err := nets.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "b"})
			return err
		}, codes.OK},
		{"reserve nic exhausted", func() error {
			_, err := nets.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "c"})
			return err
		}, codes.ResourceExhausted},
		{"delete held network", func() error { _, err := nets.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: "lan"}); return err }, codes.FailedPrecondition},
		{"release nics", func() error {
			for _, n := range []string{"a", "b"} {
				if _, err := nets.ReleaseNetworkInterface(ctx, &poolv1.ReleaseNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: n}); err != nil {
					return err
				}
			}
			return nil
		}, codes.OK},
		{"delete network", func() error { _, err := nets.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: "lan"}); return err }, codes.OK},
		{"delete network again", func() error { _, err := nets.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: "lan"}); return err }, codes.NotFound},
	}
	for _, s := range steps {
		if got := code(s.call()); got != s.want {
			t.Fatalf("%s: code %v, want %v", s.name, got, s.want)
		}
	}
}
