package fleetsim

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
)

// listMachines reads every machine's summary, page after page.
func listMachines(ctx context.Context, admin grpc.ClientConnInterface) ([]*inventoryv1.Machine, error) {
	var ms []*inventoryv1.Machine
	err := paging.All(ctx, 0, func(ctx context.Context, tok string) ([]*inventoryv1.Machine, string, error) {
		resp, err := inventoryv1.NewMachineServiceClient(admin).ListMachines(ctx, &inventoryv1.ListMachinesRequest{
			View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY, PageSize: inventory.MaxSummaryPage, PageToken: tok})
		return resp.GetMachines(), resp.GetNextPageToken(), err
	}, func(m *inventoryv1.Machine) error { ms = append(ms, m); return nil })
	return ms, err
}

// readyNodes counts the READY nodes, page after page.
func readyNodes(ctx context.Context, admin grpc.ClientConnInterface) (int, error) {
	n := 0
	err := paging.All(ctx, 0, func(ctx context.Context, tok string) ([]*poolv1.Node, string, error) {
		resp, err := poolv1.NewNodeServiceClient(admin).ListNodes(ctx, &poolv1.ListNodesRequest{PageSize: paging.MaxSize, PageToken: tok})
		return resp.GetNodes(), resp.GetNextPageToken(), err
	}, func(node *poolv1.Node) error {
		if node.GetState() == poolv1.Node_READY {
			n++
		}
		return nil
	})
	return n, err
}
