package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// storageFlags are the size flags of reserve-storage and
// schedule-storage.
type storageFlags struct {
	request uint64
	limit   uint64
}

func (f *storageFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.Var(sizeValue{&f.request}, "request-bytes", "storage to reserve: bytes or a size such as 20GiB, 100G (=100*10^9)")
	fs.Var(sizeValue{&f.limit}, "limit-bytes", "storage limit: bytes or a size")
	markRequired(cmd, "request-bytes", "limit-bytes")
}

func (inv *invocation) reserveStorageCommand() *cobra.Command {
	var f storageFlags
	cmd := &cobra.Command{
		Use:   "reserve-storage NODE STORAGE",
		Short: "Reserve storage named STORAGE on NODE and print the node",
		Args:  argsBetween(2, 2),
	}
	f.register(cmd)
	return inv.reservationCommand(cmd,
		func(args []string) string { return fmt.Sprintf("node %q: reserve storage %q", args[0], args[1]) },
		func(ctx context.Context, c poolv1.NodeServiceClient, args []string, ann map[string]string) (*poolv1.Node, error) {
			return c.ReserveStorage(ctx, &poolv1.ReserveStorageRequest{
				NodeName:     args[0],
				StorageName:  args[1],
				Annotations:  ann,
				RequestBytes: f.request,
				LimitBytes:   f.limit,
			})
		})
}

func (inv *invocation) scheduleStorageCommand() *cobra.Command {
	var f storageFlags
	cmd := &cobra.Command{
		Use:   "schedule-storage STORAGE",
		Short: "Reserve storage named STORAGE on a node chosen by corrald and print that node",
		Args:  argsBetween(1, 1),
	}
	f.register(cmd)
	return inv.reservationCommand(cmd,
		func(args []string) string { return fmt.Sprintf("schedule storage %q", args[0]) },
		func(ctx context.Context, c poolv1.NodeServiceClient, args []string, ann map[string]string) (*poolv1.Node, error) {
			return c.ScheduleStorage(ctx, &poolv1.ScheduleStorageRequest{
				StorageName:  args[0],
				Annotations:  ann,
				RequestBytes: f.request,
				LimitBytes:   f.limit,
			})
		})
}

func (inv *invocation) releaseStorageCommand() *cobra.Command {
	return inv.releaseCommand("storage", "Release the storage reservation STORAGE on NODE",
		func(ctx context.Context, c poolv1.NodeServiceClient, node, name string) error {
			_, err := c.ReleaseStorage(ctx, &poolv1.ReleaseStorageRequest{NodeName: node, StorageName: name})
			return err
		})
}
