package cli

import (
	"context"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).reprovisionCommand) }

// reprovisionCommand: corral machine reprovision NAME
func (inv *invocation) reprovisionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "reprovision NAME",
		Short: "Take a machine back to discovery: remove its node, wipe its install disk",
		Long: `reprovision is refused while the machine's node holds VMs or volumes. It
removes the node, sets boot intent discover and, with an enrolled BMC,
power-cycles the machine into PXE; without one, reboot it by hand. The
install disk is wiped when the discovery agent connects.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return inv.machineRPC(cmd, fmt.Sprintf("reprovision machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: name})
			})
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
