package cli

import (
	"context"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).powerCommand) }

var powerActions = map[string]inventoryv1.PowerAction{
	"on":    inventoryv1.PowerAction_POWER_ACTION_ON,
	"off":   inventoryv1.PowerAction_POWER_ACTION_OFF,
	"soft":  inventoryv1.PowerAction_POWER_ACTION_SOFT_OFF,
	"cycle": inventoryv1.PowerAction_POWER_ACTION_CYCLE,
	"reset": inventoryv1.PowerAction_POWER_ACTION_RESET,
}

// powerCommand: corral machine power on|off|soft|cycle|reset|status NAME
func (inv *invocation) powerCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "power on|off|soft|cycle|reset|status NAME",
		Short: "Power a machine through its BMC (on when on succeeds; cycle or reset when off powers on), or read its state",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			verb, name := strings.ToLower(args[0]), args[1]
			action, ok := powerActions[verb]
			if !ok && verb != "status" {
				return usageErrorf("unknown power action %q (valid: on, off, soft, cycle, reset, status)", args[0])
			}
			var ps *inventoryv1.PowerStatus
			err := inv.rpc(cmd, fmt.Sprintf("power %s machine %q", verb, name), func(ctx context.Context, cc *grpc.ClientConn) error {
				c := inventoryv1.NewMachineServiceClient(cc)
				var err error
				if verb == "status" {
					ps, err = c.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: name})
				} else {
					ps, err = c.SetPower(ctx, &inventoryv1.SetPowerRequest{Name: name, Action: action})
				}
				return err
			})
			if err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "power status"}, []proto.Message{ps}, false, output)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), powerStatusLine(name, ps))
			return writeErr(err)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
