package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
)

// webhookKind prints webhook receivers (WebhookService, admin only).
var webhookKind = &kind{
	name:    "webhook",
	columns: []string{"NAME", "URL", "EVENTS", "OVERFLOWED", "CUT", "CREATED"},
	row: func(m proto.Message) []string {
		r := m.(*webhookv1.Receiver)
		cut := "-"
		if r.GetCutAt() != nil {
			cut = r.GetCutAt().AsTime().UTC().Format(time.RFC3339)
		} else if strings.HasPrefix(r.GetCutReason(), "history lost:") {
			// Not cut off, but the store's history was compacted past its
			// delivery cursor: CUT_REASON (-o wide) says which revisions.
			cut = "history-lost"
		}
		return []string{r.GetName(), cell(r.GetUrl()), strings.Join(r.GetEvents(), ","), fmt.Sprint(r.GetOverflowed()), cut,
			r.GetCreatedAt().AsTime().UTC().Format(time.RFC3339)}
	},
	wide: []string{"ALLOW_INSECURE", "ALLOW_BOOT_LAN", "CUSTOM_CA", "CUT_REASON"},
	wideRow: func(m proto.Message) []string {
		r := m.(*webhookv1.Receiver)
		return []string{fmt.Sprint(r.GetAllowInsecure()), fmt.Sprint(r.GetAllowBootLan()), fmt.Sprint(len(r.GetCaPem()) > 0), cell(r.GetCutReason())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := webhookv1.NewWebhookServiceClient(cc).ListWebhooks(ctx, &webhookv1.ListWebhooksRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetReceivers()), resp.GetNextPageToken(), err
	},
}

// webhookCommand groups the webhook verbs.
func (inv *invocation) webhookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "webhook VERB",
		Aliases: []string{"webhooks"},
		Short:   "Event export: add, list, enable, remove webhook receivers (admin)",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(inv.webhookAddCommand(), inv.webhookListCommand(), inv.webhookEnableCommand(), inv.webhookRemoveCommand())
	return cmd
}

// webhookAddCommand: corral webhook add URL --events CLASSES [--name N]
// [--ca FILE] [--allow-insecure] [--allow-boot-lan]
func (inv *invocation) webhookAddCommand() *cobra.Command {
	var (
		name, ca, output       string
		events                 []string
		allowInsecure, bootLAN bool
	)
	cmd := &cobra.Command{
		Use:   "add URL --events machine.state,audit,health",
		Short: "Add a webhook receiver and print its signing secret once",
		Long: `Add a webhook receiver: the appliance POSTs CloudEvents (structured JSON,
application/cloudevents+json) to URL for the event classes named by --events:
machine.state (every machine state change), audit (every mutating call),
health (BMC health status changes, nodes going NOT_READY and back).

Each request is signed with the secret printed here (it cannot be shown
again): webhook-id, webhook-timestamp and webhook-signature as Standard
Webhooks defines them, and X-Hub-Signature-256 as GitHub does. The
webhook-id is the event's id, the same on every retry.

URL must be https:// (verified against the system roots, or only against
--ca); plain http:// needs --allow-insecure. An address on the boot LAN,
loopback or link-local is refused, when the URL names it and when a name
resolves to it at delivery, unless --allow-boot-lan.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			req := &webhookv1.AddWebhookRequest{Name: name, Url: args[0], Events: events, AllowInsecure: allowInsecure, AllowBootLan: bootLAN}
			if ca != "" {
				b, err := os.ReadFile(ca)
				if err != nil {
					return usageErrorf("--ca: %v", err)
				}
				req.CaPem = b
			}
			var resp *webhookv1.AddWebhookResponse
			if err := inv.rpc(cmd, "add webhook", func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = webhookv1.NewWebhookServiceClient(cc).AddWebhook(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if output == formatTable {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "webhook %s added; its signing secret (shown once):\n%s\n", resp.GetReceiver().GetName(), resp.GetSecret())
				return writeErr(err)
			}
			return printRecords(cmd.OutOrStdout(), webhookKind, []proto.Message{resp}, false, output)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&events, "events", nil, "event classes: machine.state, audit, health (comma-separated; required)")
	f.StringVar(&name, "name", "", "the receiver's name (default: generated)")
	f.StringVar(&ca, "ca", "", "PEM file of the only CA the receiver's certificate is verified against (default: the system roots)")
	f.BoolVar(&allowInsecure, "allow-insecure", false, "allow a plain http:// URL (events and signatures readable on the way)")
	f.BoolVar(&bootLAN, "allow-boot-lan", false, "allow a receiver address on the boot LAN, loopback or link-local")
	_ = cmd.MarkFlagRequired("events")
	addOutputFlag(cmd, &output)
	return cmd
}

// webhookListCommand: corral webhook list
func (inv *invocation) webhookListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List webhook receivers: URL, events, events dropped on overflow, when cut off",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkGetFormat(output); err != nil {
				return err
			}
			return inv.rpc(cmd, "list webhooks", func(ctx context.Context, cc *grpc.ClientConn) error {
				return inv.printList(ctx, cmd.OutOrStdout(), cc, webhookKind, pageQuery{}, 0, output)
			})
		},
	}
	addGetOutputFlag(cmd, &output)
	return cmd
}

// webhookRemoveCommand: corral webhook remove NAME
func (inv *invocation) webhookRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm", "delete"},
		Short:   "Remove a webhook receiver (its queued events are dropped)",
		Args:    argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, "remove webhook", func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := webhookv1.NewWebhookServiceClient(cc).RemoveWebhook(ctx, &webhookv1.RemoveWebhookRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "webhook %s removed\n", args[0])
			return writeErr(err)
		},
	}
}

// webhookEnableCommand: corral webhook enable NAME
func (inv *invocation) webhookEnableCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "enable NAME",
		Short: "Resume a webhook receiver that was cut off, with its URL and secret (it gets the events from now on)",
		Long: `Resume a webhook receiver that was cut off for overflowing its queue
(CUT in "corral webhook list"). Its URL and signing secret stay, so the
receiver needs no change; it gets the events after this command, not those
dropped during the cut, and its overflow count stays. It also clears a
"history lost" note. A receiver that is neither is refused.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r *webhookv1.Receiver
			if err := inv.rpc(cmd, "enable webhook", func(ctx context.Context, cc *grpc.ClientConn) error {
				resp, err := webhookv1.NewWebhookServiceClient(cc).EnableWebhook(ctx, &webhookv1.EnableWebhookRequest{Name: args[0]})
				r = resp.GetReceiver()
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "webhook %s enabled (%d events dropped in all)\n", args[0], r.GetOverflowed())
			return writeErr(err)
		},
	}
}
