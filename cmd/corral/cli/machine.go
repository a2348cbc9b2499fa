package cli

import (
	"google.golang.org/grpc"

	"context"

	"sort"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

// machineVerbs are the `corral machine` subcommands contributed by other
// files of this package (each BMC verb lives in its own file).
var machineVerbs []func(inv *invocation) *cobra.Command

// machineCommand groups the machine verbs.
func (inv *invocation) machineCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "machine VERB",
		Aliases: []string{"machines"},
		Short:   "Physical machines: accept, reprovision, maintenance, boot timeline, BMC, power",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(inv.timelineCommand())
	for _, v := range machineVerbs {
		cmd.AddCommand(v(inv))
	}
	return cmd
}

// timelineCommand prints a machine's (or a MAC's) boot timeline.
func (inv *invocation) timelineCommand() *cobra.Command {
	var limit uint32
	var output string
	cmd := &cobra.Command{
		Use:   "timeline NAME|MAC",
		Short: "Show the boot timeline of a machine or MAC: every DHCP, TFTP and HTTP decision",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			req := &inventoryv1.TimelineRequest{Limit: limit}
			if looksLikeMAC(args[0]) {
				req.Mac = args[0]
			} else {
				req.Name = args[0]
			}
			var resp *inventoryv1.TimelineResponse
			if err := inv.rpc(cmd, "timeline of "+args[0], func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = inventoryv1.NewMachineServiceClient(cc).Timeline(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if output == formatJSON || output == formatYAML {
				ms := make([]proto.Message, len(resp.GetEntries()))
				for i, e := range resp.GetEntries() {
					ms[i] = e
				}
				return printRecords(cmd.OutOrStdout(), &kind{name: "timeline entry"}, ms, true, output)
			}
			return writeErr(writeTable(cmd.OutOrStdout(), []string{"TIME", "MAC", "SOURCE", "EVENT", "DETAIL"}, timelineRows(resp.GetEntries())))
		},
	}
	cmd.Flags().Uint32Var(&limit, "limit", 200, "newest entries to show")
	addOutputFlag(cmd, &output)
	return cmd
}

func looksLikeMAC(s string) bool {
	return len(s) == 17 && (strings.Count(s, ":") == 5 || strings.Count(s, "-") == 5)
}

func timelineRows(es []*inventoryv1.TimelineEntry) [][]string {
	rows := make([][]string, 0, len(es))
	for _, e := range es {
		detail := e.GetDetail()
		attrs := make([]string, 0, len(e.GetAttributes()))
		for k, v := range e.GetAttributes() {
			attrs = append(attrs, k+"="+v)
		}
		sort.Strings(attrs)
		detail = strings.TrimSpace(detail + " " + strings.Join(attrs, " "))
		rows = append(rows, []string{e.GetAt().AsTime().UTC().Format("2006-01-02T15:04:05.000Z"), e.GetMac(), e.GetSource(), e.GetEvent(), detail})
	}
	return rows
}
