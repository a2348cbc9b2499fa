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

// timelineCommand prints a machine's (or a MAC's) boot timeline, and with
// -f follows it.
func (inv *invocation) timelineCommand() *cobra.Command {
	var limit uint32
	var output string
	var follow bool
	cmd := &cobra.Command{
		Use:   "timeline NAME|MAC",
		Short: "Show the boot timeline of a machine or MAC: every DHCP, TFTP and HTTP decision (-f follows it)",
		Long: `timeline prints the newest --limit entries of a machine's (or a MAC's) boot
timeline. -f (--follow) then prints each new entry as it is recorded, until
Ctrl-C; with -o json each entry is one JSON event per line. A follow the
appliance cuts resumes where it stopped.`,
		Args:              argsBetween(1, 1),
		ValidArgsFunction: inv.completeNames(machineKind),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if follow {
				return inv.followTimeline(cmd, args[0], limit, output)
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
			return writeErr(writeList(cmd.OutOrStdout(), "timeline entries", timelineHeader, timelineRows(resp.GetEntries())))
		},
	}
	cmd.Flags().Uint32Var(&limit, "limit", 200, "newest entries to show")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "after the newest entries, print new ones until interrupted")
	addOutputFlag(cmd, &output)
	return cmd
}

var timelineHeader = []string{"TIME", "MAC", "SOURCE", "EVENT", "DETAIL"}

// followTimeline runs `machine timeline NAME -f` over WatchTimeline.
func (inv *invocation) followTimeline(cmd *cobra.Command, target string, limit uint32, output string) error {
	req := &inventoryv1.WatchTimelineRequest{Limit: limit}
	if looksLikeMAC(target) {
		req.Mac = target
	} else {
		req.Name = target
	}
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	p := &eventPrinter{
		w: cmd.OutOrStdout(), format: output, kindName: "timeline", header: timelineHeader,
		row: func(m proto.Message) []string {
			return timelineRows([]*inventoryv1.TimelineEntry{m.(*inventoryv1.TimelineEntry)})[0]
		},
	}
	return inv.runWatch(cmd.Context(), "timeline of "+target, func(ctx context.Context, from int64) (recvFunc, error) {
		r := proto.Clone(req).(*inventoryv1.WatchTimelineRequest)
		r.FromRevision = from
		s, err := inventoryv1.NewMachineServiceClient(cc).WatchTimeline(ctx, r)
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *inventoryv1.TimelineEvent) proto.Message { return nonNil(e.GetEntry()) }), nil
	}, p)
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
