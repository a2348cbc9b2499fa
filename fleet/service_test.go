package fleet

import (
	"context"
	"net"
	"testing"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func serve(t *testing.T, svc *Service) fleetv1.ApplianceServiceClient {
	t.Helper()
	srv := grpc.NewServer()
	Register(srv, svc)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return fleetv1.NewApplianceServiceClient(cc)
}

func TestListAppliances(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	defer st.Close()
	now := t0
	for name, age := range map[string]time.Duration{"a1": time.Second, "a2": 2 * time.Second, "a3": time.Minute} {
		a := appliance(name, name+":20180", nil, nil)
		a.LastHeartbeat = timestamppb.New(now.Add(-age))
		if _, err := record.Put(ctx, st, AppliancePrefix+name, a, 0); err != nil {
			t.Fatal(err)
		}
	}
	for m, r := range map[string]string{"m0": "a1", "m1": "a2", "m2": "a2", "m3": "a3"} {
		assign(t, st, m, r)
	}
	if _, err := st.Put(ctx, AppliancePrefix+"junk", []byte("not a record"), 0); err != nil {
		t.Fatal(err)
	}
	c := serve(t, &Service{Store: st, Now: func() time.Time { return now }, Leader: func(context.Context) (string, error) { return "a2", nil }})
	resp, err := c.ListAppliances(ctx, &fleetv1.ListAppliancesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name     string
		Role     fleetv1.Appliance_Role
		Assigned uint32
	}
	var got []row
	for _, a := range resp.GetAppliances() {
		got = append(got, row{a.GetName(), a.GetRole(), a.GetAssigned()})
	}
	want := []row{
		{"a1", fleetv1.Appliance_RUNNER, 1},
		{"a2", fleetv1.Appliance_LEADER, 2},
		{"a3", fleetv1.Appliance_EXPIRED, 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("appliances (-want +got):\n%s", diff)
	}
	if resp.GetLeader() != "a2" {
		t.Errorf("leader %q, want a2", resp.GetLeader())
	}
}

func TestFetchArtifactIsPluggable(t *testing.T) {
	ctx := context.Background()
	svc := &Service{Store: mem.New()}
	c := serve(t, svc)
	stream, err := c.FetchArtifact(ctx, &fleetv1.FetchArtifactRequest{Sha256: "ab"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("FetchArtifact with no function: %v, want Unimplemented", err)
	}

	svc2 := &Service{Store: mem.New(), FetchArtifact: func(req *fleetv1.FetchArtifactRequest, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
		return s.Send(&fleetv1.ArtifactChunk{Name: "kernel", Size: 3, Data: []byte(req.GetSha256())})
	}}
	c2 := serve(t, svc2)
	stream, err = c2.FetchArtifact(ctx, &fleetv1.FetchArtifactRequest{Sha256: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	chunk, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&fleetv1.ArtifactChunk{Name: "kernel", Size: 3, Data: []byte("abc")}, chunk, protocmp.Transform()); diff != "" {
		t.Error(diff)
	}
}

func TestPeers(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	defer st.Close()
	for name, age := range map[string]time.Duration{"self": 0, "b": time.Second, "a": 2 * time.Second, "dead": time.Hour} {
		a := appliance(name, name+".example:20180", nil, nil)
		a.LastHeartbeat = timestamppb.New(time.Now().Add(-age))
		if _, err := record.Put(ctx, st, AppliancePrefix+name, a, 0); err != nil {
			t.Fatal(err)
		}
	}
	p := &Peers{Store: st, Self: "self"}
	if diff := cmp.Diff([]string{"a.example:20180", "b.example:20180"}, p.Endpoints(ctx)); diff != "" {
		t.Error(diff)
	}
}
