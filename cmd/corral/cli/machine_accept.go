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
	var disk, output string
	var wipe bool
	cmd := &cobra.Command{
		Use:   "accept NAME",
		Short: "Install an INVENTORIED (or FAILED) machine as a hypervisor node",
		Long: `accept sends the machine's discovery agent an install plan: partition and
format the disk, write the node identity, then reboot into the hypervisor.
The machine is INSTALLING until its node reports READY (DEPLOYED).

--disk auto takes the largest non-removable disk the machine reported. A
disk that already holds data is refused by the agent unless --wipe.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return inv.machineRPC(cmd, fmt.Sprintf("accept machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: name, Disk: disk, Wipe: wipe})
			})
		},
	}
	cmd.Flags().StringVar(&disk, "disk", "auto", "install disk: auto or a device such as /dev/vdb")
	cmd.Flags().BoolVar(&wipe, "wipe", false, "erase the disk if it already holds partitions or a filesystem")
	addOutputFlag(cmd, &output)
	return cmd
}
