package inventory

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/store/bolt"
)

// TestWatchHidesOthersMachines: a caller that is not an operator watching
// the machines sees one that another caller allocates leave (DELETED) and
// come back when it is released.
func TestWatchHidesOthersMachines(t *testing.T) {
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{HistoryEvents: 512})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	inv := newInv(t, Config{Store: st})
	create(t, inv, poolMachine("w1", 16, 2), poolMachine("w2", 16, 2))
	// The caller is the "owner" metadata of the call.
	caller := func(ctx context.Context) Owner {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("owner"); len(v) == 1 {
			return Owner{ID: v[0]}
		}
		return Owner{}
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Register(srv, &MachineServer{Inv: inv, Caller: caller})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cli := inventoryv1.NewMachineServiceClient(conn)
	as := func(who string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "owner", who)
	}
	w, err := cli.WatchMachines(as("token:bob"), &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lines, _ := recv(t, 3, w.Recv, machineLine)
	if lines[2] != "SYNCED" {
		t.Fatalf("initial %v", lines)
	}
	got, err := cli.AllocateMachines(as("token:alice"), &inventoryv1.AllocateMachinesRequest{Selector: "name=w1"})
	if err != nil || len(got.GetMachines()) != 1 {
		t.Fatalf("allocate: %v %v", got, err)
	}
	ev, err := w.Recv()
	if err != nil || ev.GetType() != watchv1.EventType_DELETED || ev.GetMachine().GetName() != "w1" {
		t.Fatalf("bob's watch after alice's allocation: %v %v", ev, err)
	}
	if _, err := cli.ReleaseMachine(as("token:alice"), &inventoryv1.ReleaseMachineRequest{Name: "w1"}); err != nil {
		t.Fatal(err)
	}
	ev, err = w.Recv()
	if err != nil || ev.GetType() == watchv1.EventType_DELETED || ev.GetMachine().GetName() != "w1" || ev.GetMachine().GetState() != inventoryv1.Machine_READY {
		t.Fatalf("bob's watch after the release: %v %v", ev, err)
	}
}
