package cli

import (
	"context"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

func (inv *invocation) getCommand() *cobra.Command {
	var output string
	var watch bool
	var limit int
	var mf machineFilter
	var ef eventFilter
	cmd := &cobra.Command{
		Use:   "get KIND [NAME]",
		Short: "List records of a kind, or show one; -w follows changes",
		Long: `get lists every record of KIND, or only NAME, as a table (default), a
wider table (-o wide), KIND/NAME lines (-o name), JSON or YAML. JSON and YAML
use proto field names; a list is an array.

Lists are read a page at a time and printed as each page arrives (a
table's columns are aligned within a page); --limit N stops after N
records. Machine filters (--state, --serial, --mac, -l) and --sort-by run
on the appliance.

-w (--watch) prints the list, then a row for every change until Ctrl-C
(kinds machine, node, network, vm, bs, and events); with -o json each change
is one JSON event per line: {"type":"MODIFIED","revision":"42",<kind>:{...}}.
A watch the appliance cuts resumes from the last revision seen.

Kinds: ` + kindList() + `, the fleet's ` + strings.Join(applianceNames, "|") + `,
the standby pools' ` + strings.Join(standbyPoolNames, "|") + ` (status as the controller last saw it),
and the audit stream's ` + strings.Join(eventNames, "|") + ` (who called which mutating RPC, on what,
and how it ended: --since, --machine).`,
		Args:              argsBetween(1, 2),
		ValidArgsFunction: inv.completeKindAndName(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkGetFormat(output); err != nil {
				return err
			}
			if isEventsKind(args[0]) {
				if len(args) == 2 {
					return usageErrorf("get events takes no NAME (filter with --machine)")
				}
				if mf.set() {
					return usageErrorf("--state, --serial, --mac and --selector filter the machine list only")
				}
				return inv.getEvents(cmd, &ef, output, watch)
			}
			if ef.set() {
				return usageErrorf("--since and --machine filter the events only")
			}
			k, err := getKindArg(args[0])
			if err != nil {
				return err
			}
			req, err := mf.request(k, len(args) == 2)
			if err != nil {
				return err
			}
			if watch {
				return inv.watchKind(cmd, k, args[1:], req, output)
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
			if limit < 0 {
				return usageErrorf("--limit %d: want 0 (no limit) or more", limit)
			}
			q := pageQuery{timeout: inv.timeout}
			if k == machineKind {
				q.machines = mf.list(req, output)
			}
			// Each page has the RPC deadline; the whole list has none.
			return inv.printList(cmd.Context(), cmd.OutOrStdout(), cc, k, q, limit, output)
		},
	}
	addGetOutputFlag(cmd, &output)
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after the list, print every change until interrupted")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most this many records (0: all); the list is read a page at a time and printed as it arrives")
	mf.register(cmd)
	ef.register(cmd)
	return cmd
}

// watchKind runs `get KIND [NAME] -w`.
func (inv *invocation) watchKind(cmd *cobra.Command, k *kind, name []string, req *inventoryv1.ListMachinesRequest, output string) error {
	if k.watch == nil {
		return usageErrorf("%ss cannot be watched (watchable: machine, node, network, virtual_machine, block_storage, events)", k.name)
	}
	q := watchQuery{summary: output != formatJSON && output != formatYAML}
	if len(name) == 1 {
		q.name = name[0]
	}
	if req != nil {
		if req.GetSerial() != "" || req.GetMac() != "" || len(req.GetSelectors()) > 0 {
			return usageErrorf("--watch filters machines by --state only")
		}
		q.state = req.GetState()
	}
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	subject := "watch " + k.name + "s"
	if q.name != "" {
		subject = "watch " + k.subject(q.name)
	}
	header, _ := k.table(nil, output)
	p := &eventPrinter{
		w: cmd.OutOrStdout(), format: output, kindName: k.name, header: header,
		row: func(m proto.Message) []string { return k.cells(m, output) },
	}
	return inv.runWatch(cmd.Context(), subject, func(ctx context.Context, from int64) (recvFunc, error) {
		q := q
		q.from = from
		return k.watch(ctx, cc, q)
	}, p)
}

// machineFilter holds the `get machines` filters.
type machineFilter struct {
	state, serial, mac, sortBy, owner string
	selectors                         []string
}

// list returns the ListMachines request a `get machines` list sends: the
// filters of req (nil: none), the order, and the SUMMARY view for tables
// and names (FULL for JSON and YAML, which print whole records).
func (f *machineFilter) list(req *inventoryv1.ListMachinesRequest, output string) *inventoryv1.ListMachinesRequest {
	if req == nil {
		req = &inventoryv1.ListMachinesRequest{}
	}
	req.OrderBy = f.sortBy
	req.View = inventoryv1.MachineView_MACHINE_VIEW_SUMMARY
	if output == formatJSON || output == formatYAML {
		req.View = inventoryv1.MachineView_MACHINE_VIEW_FULL
	}
	return req
}

func (f *machineFilter) set() bool {
	return f.state != "" || f.serial != "" || f.mac != "" || f.owner != "" || len(f.selectors) > 0
}

func (f *machineFilter) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.state, "state", "", "machines: only this state (discovered, inventoried, installing, deployed, failed, maintenance, ready, allocated)")
	fs.StringVar(&f.serial, "serial", "", "machines: only this serial number")
	fs.StringVar(&f.mac, "mac", "", "machines: only the machine with this MAC")
	fs.StringVar(&f.sortBy, "sort-by", "", "machines: order on the appliance by name, state, serial, created_at or updated_at, with \" desc\" to reverse (default name)")
	fs.StringArrayVarP(&f.selectors, "selector", "l", nil, "machines: selector KEY OP VALUE over facts, labels (label.KEY), zone and pool, e.g. 'memory_bytes>=64Gi', 'pool=ci,zone=a,disks.count>=2', 'vendor=Dell Inc.' (repeatable, comma-separated, all must match)")
	fs.StringVar(&f.owner, "owner", "", "machines: only those allocated to this owner: me, or token:ID")
}

// request returns the ListMachines request for the filters, nil when none
// is set; filters on another kind or with a NAME are usage errors.
func (f *machineFilter) request(k *kind, named bool) (*inventoryv1.ListMachinesRequest, error) {
	if !f.set() {
		if f.sortBy != "" && (k != machineKind || named) {
			return nil, usageErrorf("--sort-by orders the machine list only")
		}
		return nil, nil
	}
	if k != machineKind || named {
		return nil, usageErrorf("--state, --serial, --mac and --selector filter the machine list only")
	}
	req := &inventoryv1.ListMachinesRequest{Serial: f.serial, Mac: f.mac, Selectors: f.selectors, Owner: f.owner}
	if f.state != "" {
		v, ok := inventoryv1.Machine_MachineState_value[strings.ToUpper(f.state)]
		if !ok || v == 0 {
			return nil, usageErrorf("--state %q: want discovered, inventoried, installing, deployed, failed, maintenance, ready or allocated", f.state)
		}
		req.State = inventoryv1.Machine_MachineState(v)
	}
	return req, nil
}
