package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// nodeCommand groups the node pool verbs: compute and storage budgets.
func (inv *invocation) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "node VERB",
		Aliases: []string{"nodes"},
		Short:   "Reserve, schedule and release compute and storage on nodes",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		inv.reserveComputeCommand(),
		inv.releaseComputeCommand(),
		inv.scheduleComputeCommand(),
		inv.reserveStorageCommand(),
		inv.releaseStorageCommand(),
		inv.scheduleStorageCommand(),
	)
	return cmd
}

// nodeCall makes one NodeService RPC of a reserve or schedule verb from
// its arguments and --annotation values, and returns the updated node.
type nodeCall func(ctx context.Context, c poolv1.NodeServiceClient, args []string, ann map[string]string) (*poolv1.Node, error)

// reservationCommand completes a reserve or schedule verb of `corral
// node` whose Use, Short, Args and own flags cmd already has: it adds
// --annotation and -o, checks them, makes call (subject names it in
// messages) and prints the node it returns.
func (inv *invocation) reservationCommand(cmd *cobra.Command, subject func(args []string) string, call nodeCall) *cobra.Command {
	var (
		output      string
		annotations []string
	)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkFormat(output); err != nil {
			return err
		}
		ann, err := parseAnnotations(annotations)
		if err != nil {
			return err
		}
		var node *poolv1.Node
		if err := inv.rpc(cmd, subject(args), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
			node, err = call(ctx, poolv1.NewNodeServiceClient(cc), args, ann)
			return err
		}); err != nil {
			return err
		}
		return printRecord(cmd, nodeKind, node, output)
	}
	addAnnotationFlag(cmd, &annotations)
	addOutputFlag(cmd, &output)
	return cmd
}

// releaseCommand is the release verb of `corral node` for a reservation
// of type what ("compute"): "release-<what> NODE NAME" makes call and
// prints "node/NODE: <what> NAME released".
func (inv *invocation) releaseCommand(what, short string, call func(ctx context.Context, c poolv1.NodeServiceClient, node, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:   fmt.Sprintf("release-%s NODE %s", what, strings.ToUpper(what)),
		Short: short,
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, fmt.Sprintf("node %q: release %s %q", args[0], what, args[1]), func(ctx context.Context, cc *grpc.ClientConn) error {
				return call(ctx, poolv1.NewNodeServiceClient(cc), args[0], args[1])
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "node/%s: %s %s released\n", args[0], what, args[1])
			return writeErr(err)
		},
	}
}

// networkCommand groups the network pool verbs: interface addresses.
func (inv *invocation) networkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "network VERB",
		Aliases: []string{"networks", "net"},
		Short:   "Reserve and release network interfaces (addresses) on networks",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		inv.reserveInterfaceCommand(),
		inv.releaseInterfaceCommand(),
	)
	return cmd
}

// addAnnotationFlag registers the repeatable --annotation k=v.
func addAnnotationFlag(cmd *cobra.Command, p *[]string) {
	cmd.Flags().StringArrayVar(p, "annotation", nil, "annotation KEY=VALUE on the reservation (repeatable)")
}

// parseAnnotations turns --annotation KEY=VALUE flags into a map; nil
// when none.
func parseAnnotations(kvs []string) (map[string]string, error) {
	return parseKeyValues("--annotation", kvs)
}

// parseKeyValues turns the KEY=VALUE values of a repeatable flag into a
// map; nil when none. An empty key or a key given twice is a usage error
// naming flag.
func parseKeyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usageErrorf("%s %q: want KEY=VALUE", flag, kv)
		}
		if _, dup := out[k]; dup {
			return nil, usageErrorf("%s %q: key %q given twice", flag, kv, k)
		}
		out[k] = v
	}
	return out, nil
}

// markRequired marks flags that were just registered on cmd as required;
// MarkFlagRequired fails only for unknown names, so its error is dropped.
func markRequired(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		_ = cmd.MarkFlagRequired(n)
	}
}

// printRecord writes one updated record in format f.
func printRecord(cmd *cobra.Command, k *kind, m proto.Message, f string) error {
	return printRecords(cmd.OutOrStdout(), k, []proto.Message{m}, false, f)
}
