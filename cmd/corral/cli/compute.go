package cli

import (
	"google.golang.org/grpc"

	"context"

	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// computeFlags are the flags of reserve-compute and schedule-compute.
type computeFlags struct {
	output      string
	annotations []string
	requestCPU  uint32
	limitCPU    uint32
	requestMem  uint64
	limitMem    uint64
}

func (f *computeFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.Uint32Var(&f.requestCPU, "request-cpu-milli-core", 0, "CPU to reserve, in thousandths of a core")
	fs.Uint32Var(&f.limitCPU, "limit-cpu-milli-core", 0, "CPU limit, in thousandths of a core")
	fs.Var(sizeValue{&f.requestMem}, "request-memory-bytes", "memory to reserve: bytes or a size such as 512MiB, 4GiB, 4G (=4*10^9)")
	fs.Var(sizeValue{&f.limitMem}, "limit-memory-bytes", "memory limit: bytes or a size")
	addAnnotationFlag(cmd, &f.annotations)
	addOutputFlag(cmd, &f.output)
	markRequired(cmd, "request-cpu-milli-core", "limit-cpu-milli-core", "request-memory-bytes", "limit-memory-bytes")
}

func (inv *invocation) reserveComputeCommand() *cobra.Command {
	var f computeFlags
	cmd := &cobra.Command{
		Use:   "reserve-compute NODE COMPUTE",
		Short: "Reserve CPU and memory named COMPUTE on NODE and print the node",
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
			if err := inv.rpc(cmd, fmt.Sprintf("node %q: reserve compute %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				node, err = poolv1.NewNodeServiceClient(cc).ReserveCompute(ctx, &poolv1.ReserveComputeRequest{
					NodeName:            args[0],
					ComputeName:         args[1],
					Annotations:         ann,
					RequestCpuMilliCore: f.requestCPU,
					LimitCpuMilliCore:   f.limitCPU,
					RequestMemoryBytes:  f.requestMem,
					LimitMemoryBytes:    f.limitMem,
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

func (inv *invocation) scheduleComputeCommand() *cobra.Command {
	var f computeFlags
	cmd := &cobra.Command{
		Use:   "schedule-compute COMPUTE",
		Short: "Reserve CPU and memory named COMPUTE on a node chosen by corrald and print that node",
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
			if err := inv.rpc(cmd, fmt.Sprintf("schedule compute %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				node, err = poolv1.NewNodeServiceClient(cc).ScheduleCompute(ctx, &poolv1.ScheduleComputeRequest{
					ComputeName:         args[0],
					Annotations:         ann,
					RequestCpuMilliCore: f.requestCPU,
					LimitCpuMilliCore:   f.limitCPU,
					RequestMemoryBytes:  f.requestMem,
					LimitMemoryBytes:    f.limitMem,
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

func (inv *invocation) releaseComputeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "release-compute NODE COMPUTE",
		Short: "Release the compute reservation COMPUTE on NODE",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, fmt.Sprintf("node %q: release compute %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := poolv1.NewNodeServiceClient(cc).ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: args[0], ComputeName: args[1]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "node/%s: compute %s released\n", args[0], args[1])
			return writeErr(err)
		},
	}
}
