package cli

import (
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

func (inv *invocation) getCommand() *cobra.Command {
	var output string
	var mf machineFilter
	cmd := &cobra.Command{
		Use:   "get KIND [NAME]",
		Short: "List records of a kind, or show one",
		Long: `get lists every record of KIND, or only NAME, as a table (default), JSON
or YAML. JSON and YAML use proto field names; a list is an array.

Kinds: ` + kindList() + `, and the fleet's ` + strings.Join(applianceNames, "|") + `.`,
		Args: argsBetween(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			k, err := getKindArg(args[0])
			if err != nil {
				return err
			}
			req, err := mf.request(k, len(args) == 2)
			if err != nil {
				return err
			}
			cc, err := inv.connect(cmd.Flags())
			if err != nil {
				return err
			}
			ctx, cancel := inv.callContext(cmd)
			defer cancel()
			if len(args) == 2 {
				m, err := k.get(ctx, cc, args[1])
				if err != nil {
					return inv.callError(k.subject(args[1]), err)
				}
				return printRecords(cmd.OutOrStdout(), k, []proto.Message{m}, false, output)
			}
			var ms []proto.Message
			if req != nil {
				var resp *inventoryv1.ListMachinesResponse
				resp, err = inventoryv1.NewMachineServiceClient(cc).ListMachines(ctx, req)
				ms = messages(resp.GetMachines())
			} else {
				ms, err = k.list(ctx, cc)
			}
			if err != nil {
				return inv.callError("list "+k.name+"s", err)
			}
			sortByName(ms)
			return printRecords(cmd.OutOrStdout(), k, ms, true, output)
		},
	}
	addOutputFlag(cmd, &output)
	mf.register(cmd)
	return cmd
}

// machineFilter holds the `get machines` filters.
type machineFilter struct {
	state, serial, mac string
	selectors          []string
}

func (f *machineFilter) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.state, "state", "", "machines: only this state (discovered, inventoried, installing, deployed, failed, maintenance)")
	fs.StringVar(&f.serial, "serial", "", "machines: only this serial number")
	fs.StringVar(&f.mac, "mac", "", "machines: only the machine with this MAC")
	fs.StringArrayVarP(&f.selectors, "selector", "l", nil, "machines: fact selector KEY OP VALUE, e.g. 'memory_bytes>=64Gi', 'disk.count>=2', 'vendor=Dell Inc.' (repeatable, all must match)")
}

// request returns the ListMachines request for the filters, nil when none
// is set; filters on another kind or with a NAME are usage errors.
func (f *machineFilter) request(k *kind, named bool) (*inventoryv1.ListMachinesRequest, error) {
	if f.state == "" && f.serial == "" && f.mac == "" && len(f.selectors) == 0 {
		return nil, nil
	}
	if k != machineKind || named {
		return nil, usageErrorf("--state, --serial, --mac and --selector filter the machine list only")
	}
	req := &inventoryv1.ListMachinesRequest{Serial: f.serial, Mac: f.mac, Selectors: f.selectors}
	if f.state != "" {
		v, ok := inventoryv1.Machine_MachineState_value[strings.ToUpper(f.state)]
		if !ok || v == 0 {
			return nil, usageErrorf("--state %q: want discovered, inventoried, installing, deployed, failed or maintenance", f.state)
		}
		req.State = inventoryv1.Machine_MachineState(v)
	}
	return req, nil
}
