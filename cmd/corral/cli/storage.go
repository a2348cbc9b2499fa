package cli

import (
	"google.golang.org/grpc"

	"context"

	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// storageFlags are the flags of reserve-storage and schedule-storage.
type storageFlags struct {
	output      string
	annotations []string
	request     uint64
	limit       uint64
}

func (f *storageFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.Var(sizeValue{&f.request}, "request-bytes", "storage to reserve: bytes or a size such as 20GiB, 100G (=100*10^9)")
	fs.Var(sizeValue{&f.limit}, "limit-bytes", "storage limit: bytes or a size")
	addAnnotationFlag(cmd, &f.annotations)
	addOutputFlag(cmd, &f.output)
	markRequired(cmd, "request-bytes", "limit-bytes")
}

func (inv *invocation) reserveStorageCommand() *cobra.Command {
	var f storageFlags
	cmd := &cobra.Command{
		Use:   "reserve-storage NODE STORAGE",
		Short: "Reserve storage named STORAGE on NODE and print the node",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(f.output); err != nil {
				return err
			}
			ann, err := parseAnnotations(f.annotations)
			if err != nil {
				return err
			}
			var node *poolv1.Node
			if err := inv.rpc(cmd, fmt.Sprintf("node %q: reserve storage %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				node, err = poolv1.NewNodeServiceClient(cc).ReserveStorage(ctx, &poolv1.ReserveStorageRequest{
					NodeName:     args[0],
					StorageName:  args[1],
					Annotations:  ann,
					RequestBytes: f.request,
					LimitBytes:   f.limit,
				})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, nodeKind, node, f.output)
		},
	}
	f.register(cmd)
	return cmd
}

func (inv *invocation) scheduleStorageCommand() *cobra.Command {
	var f storageFlags
	cmd := &cobra.Command{
		Use:   "schedule-storage STORAGE",
		Short: "Reserve storage named STORAGE on a node chosen by corrald and print that node",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(f.output); err != nil {
				return err
			}
			ann, err := parseAnnotations(f.annotations)
			if err != nil {
				return err
			}
			var node *poolv1.Node
			if err := inv.rpc(cmd, fmt.Sprintf("schedule storage %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				node, err = poolv1.NewNodeServiceClient(cc).ScheduleStorage(ctx, &poolv1.ScheduleStorageRequest{
					StorageName:  args[0],
					Annotations:  ann,
					RequestBytes: f.request,
					LimitBytes:   f.limit,
				})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, nodeKind, node, f.output)
		},
	}
	f.register(cmd)
	return cmd
}

func (inv *invocation) releaseStorageCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "release-storage NODE STORAGE",
		Short: "Release the storage reservation STORAGE on NODE",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, fmt.Sprintf("node %q: release storage %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := poolv1.NewNodeServiceClient(cc).ReleaseStorage(ctx, &poolv1.ReleaseStorageRequest{NodeName: args[0], StorageName: args[1]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "node/%s: storage %s released\n", args[0], args[1])
			return writeErr(err)
		},
	}
}
