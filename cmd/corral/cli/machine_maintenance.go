package cli

import (
	"context"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).maintenanceCommand) }

// maintenanceCommand: corral machine maintenance on|off NAME [--reason R]
func (inv *invocation) maintenanceCommand() *cobra.Command {
	var reason, output string
	cmd := &cobra.Command{
		Use:   "maintenance on|off NAME",
		Short: "Hold a machine in MAINTENANCE (boots its local disk, no automation) or release it",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var on bool
			switch strings.ToLower(args[0]) {
			case "on":
				on = true
			case "off":
			default:
				return usageErrorf("maintenance %q: use on or off", args[0])
			}
			name := args[1]
			return inv.machineRPC(cmd, fmt.Sprintf("maintenance %s machine %q", strings.ToLower(args[0]), name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: name, On: on, Reason: reason})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the machine is held (shown as its state reason)")
	addOutputFlag(cmd, &output)
	return cmd
}
