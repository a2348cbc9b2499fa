package cli

import (
	"context"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

func init() {
	machineVerbs = append(machineVerbs, (*invocation).adoptCommand, (*invocation).rejectCommand)
}

// adoptCommand: corral machine adopt NAME [--separate]
func (inv *invocation) adoptCommand() *cobra.Command {
	var output string
	var separate bool
	cmd := &cobra.Command{
		Use:   "adopt NAME",
		Short: "Accept a parked report (a machine in CONFLICT) as the machine it claimed to be",
		Long: `A discovery report that claims a machine's identity without proving it (a
known serial from a MAC the machine never booted from or listed, a report
that lacks or contradicts an identifier the machine holds, a BMC address
enrolled for another machine) is parked as a machine of its own in CONFLICT,
named conflict-<boot MAC>. describe shows what it claimed and why it was
parked.

adopt says the report is right: the machine it claimed takes the report's
identity (serial, system UUID, baseboard serial, TPM key), facts and boot
MAC, and the parked record goes. With --separate, the report becomes a
machine of its own instead (two machines that really share a serial).`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return inv.machineRPC(cmd, fmt.Sprintf("adopt machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.AdoptMachine(ctx, &inventoryv1.AdoptMachineRequest{Name: name, Separate: separate})
			})
		},
	}
	cmd.Flags().BoolVar(&separate, "separate", false, "adopt the report as a machine of its own instead of the one it claimed")
	addOutputFlag(cmd, &output)
	return cmd
}

// rejectCommand: corral machine reject NAME
func (inv *invocation) rejectCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "reject NAME",
		Short: "Delete a parked report (a machine in CONFLICT)",
		Long: `reject deletes a parked report and its MAC binding; the machine it claimed
to be is untouched. A machine that keeps making the same claim is parked
again (and its reports are on the timeline of its MAC).`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := inv.rpc(cmd, fmt.Sprintf("reject machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := inventoryv1.NewMachineServiceClient(cc).RejectMachine(ctx, &inventoryv1.RejectMachineRequest{Name: name})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "machine %s rejected\n", name)
			return writeErr(err)
		},
	}
}
