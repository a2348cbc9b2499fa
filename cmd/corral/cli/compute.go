package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// computeFlags are the CPU and memory flags of reserve-compute and
// schedule-compute.
type computeFlags struct {
	requestCPU uint32
	limitCPU   uint32
	requestMem uint64
	limitMem   uint64
}

func (f *computeFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.Uint32Var(&f.requestCPU, "request-cpu-milli-core", 0, "CPU to reserve, in thousandths of a core")
	fs.Uint32Var(&f.limitCPU, "limit-cpu-milli-core", 0, "CPU limit, in thousandths of a core")
	fs.Var(sizeValue{&f.requestMem}, "request-memory-bytes", "memory to reserve: bytes or a size such as 512MiB, 4GiB, 4G (=4*10^9)")
	fs.Var(sizeValue{&f.limitMem}, "limit-memory-bytes", "memory limit: bytes or a size")
	markRequired(cmd, "request-cpu-milli-core", "limit-cpu-milli-core", "request-memory-bytes", "limit-memory-bytes")
}

func (inv *invocation) reserveComputeCommand() *cobra.Command {
	var f computeFlags
	cmd := &cobra.Command{
		Use:   "reserve-compute NODE COMPUTE",
		Short: "Reserve CPU and memory named COMPUTE on NODE and print the node",
		Args:  argsBetween(2, 2),
	}
	f.register(cmd)
	return inv.reservationCommand(cmd,
		func(args []string) string { return fmt.Sprintf("node %q: reserve compute %q", args[0], args[1]) },
		func(ctx context.Context, c poolv1.NodeServiceClient, args []string, ann map[string]string) (*poolv1.Node, error) {
			return c.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{
				NodeName:            args[0],
				ComputeName:         args[1],
				Annotations:         ann,
				RequestCpuMilliCore: f.requestCPU,
				LimitCpuMilliCore:   f.limitCPU,
				RequestMemoryBytes:  f.requestMem,
				LimitMemoryBytes:    f.limitMem,
			})
		})
}

func (inv *invocation) scheduleComputeCommand() *cobra.Command {
	var f computeFlags
	cmd := &cobra.Command{
		Use:   "schedule-compute COMPUTE",
		Short: "Reserve CPU and memory named COMPUTE on a node chosen by corrald and print that node",
		Args:  argsBetween(1, 1),
	}
	f.register(cmd)
	return inv.reservationCommand(cmd,
		func(args []string) string { return fmt.Sprintf("schedule compute %q", args[0]) },
		func(ctx context.Context, c poolv1.NodeServiceClient, args []string, ann map[string]string) (*poolv1.Node, error) {
			return c.ScheduleCompute(ctx, &poolv1.ScheduleComputeRequest{
				ComputeName:         args[0],
				Annotations:         ann,
				RequestCpuMilliCore: f.requestCPU,
				LimitCpuMilliCore:   f.limitCPU,
				RequestMemoryBytes:  f.requestMem,
				LimitMemoryBytes:    f.limitMem,
			})
		})
}

func (inv *invocation) releaseComputeCommand() *cobra.Command {
	return inv.releaseCommand("compute", "Release the compute reservation COMPUTE on NODE",
		func(ctx context.Context, c poolv1.NodeServiceClient, node, name string) error {
			_, err := c.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: node, ComputeName: name})
			return err
		})
}
