package appliance

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/store/record"
)

// TestWatchBlockStoragesAndVMs: a real create on a fake node shows up on
// the block storage watch with the state Get returns; VM records stream
// the same way; a bad name and a future revision are refused.
func TestWatchBlockStoragesAndVMs(t *testing.T) {
	e := newBoltEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bw, err := e.bs.WatchBlockStorages(ctx, &provisioningv1.WatchBlockStoragesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	vw, err := e.vm.WatchVirtualMachines(ctx, &provisioningv1.WatchVirtualMachinesRequest{Name: "vm1"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := bw.Recv(); err != nil || ev.GetType().String() != "SYNCED" {
		t.Fatalf("empty list: %v, %v; want SYNCED", ev, err)
	}
	if ev, err := vw.Recv(); err != nil || ev.GetType().String() != "SYNCED" {
		t.Fatalf("empty list: %v, %v; want SYNCED", ev, err)
	}
	created := e.mkBS(t, "d1", "n1")
	var last *provisioningv1.BlockStorageEvent
	for last == nil || last.GetBlockStorage().GetState() != created.GetState() {
		if last, err = bw.Recv(); err != nil {
			t.Fatal(err)
		}
		if last.GetBlockStorage().GetName() != "d1" {
			t.Fatalf("event for %v", last)
		}
	}
	got, err := e.bs.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: "d1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got.String(), last.GetBlockStorage().String()); diff != "" {
		t.Fatalf("watched block storage differs from Get (-get +watch):\n%s", diff)
	}
	// VM records: one watched by name, another (vm10) not.
	for _, name := range []string{"vm10", "vm1"} {
		if _, err := record.Put(ctx, e.st, vmPrefix+name, &provisioningv1.VirtualMachine{Name: name, LimitCpuMilliCore: 1000}, 0); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := vw.Recv()
	if err != nil || fmt.Sprint(ev.GetType(), " ", ev.GetVirtualMachine().GetName()) != "ADDED vm1" {
		t.Fatalf("vm watch: %v, %v; want ADDED vm1", ev, err)
	}
	for name, req := range map[string]*provisioningv1.WatchVirtualMachinesRequest{
		"bad name": {Name: "a/b"},
		"future":   {FromRevision: 1 << 40},
	} {
		s, err := e.vm.WatchVirtualMachines(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]codes.Code{"bad name": codes.InvalidArgument, "future": codes.OutOfRange}[name]
		if _, err := s.Recv(); status.Code(err) != want {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
}
