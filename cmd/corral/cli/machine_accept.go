package cli

import (
	"context"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).acceptCommand) }

// acceptCommand: corral machine accept NAME [--disk auto|/dev/...] [--wipe]
func (inv *invocation) acceptCommand() *cobra.Command {
	var disk, output, target string
	var wipe bool
	cmd := &cobra.Command{
		Use:   "accept NAME [--target hypervisor|pool]",
		Short: "Install an INVENTORIED (or FAILED) machine as a hypervisor node, or make it READY for people",
		Long: `accept sends the machine's discovery agent an install plan: partition and
format the disk, write the node identity, then reboot into the hypervisor.
The machine is INSTALLING until its node reports READY (DEPLOYED).

--disk auto takes the largest non-removable disk the machine reported. A
disk that already holds data is refused by the agent unless --wipe.

--target pool installs nothing: the machine becomes READY, free for people
to allocate (corral machine allocate); --disk and --wipe do not apply.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			req := &inventoryv1.AcceptMachineRequest{Name: name, Disk: disk, Wipe: wipe}
			switch target {
			case "hypervisor":
			case "pool":
				req.Target = inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL
			default:
				return usageErrorf("--target %q: want hypervisor or pool", target)
			}
			return inv.machineRPC(cmd, fmt.Sprintf("accept machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.AcceptMachine(ctx, req)
			})
		},
	}
	cmd.Flags().StringVar(&target, "target", "hypervisor", "what the machine becomes: hypervisor (a node of the VM pool) or pool (READY for allocation)")
	cmd.Flags().StringVar(&disk, "disk", "auto", "install disk: auto or a device such as /dev/vdb")
	cmd.Flags().BoolVar(&wipe, "wipe", false, "erase the disk if it already holds partitions or a filesystem")
	addOutputFlag(cmd, &output)
	return cmd
}
