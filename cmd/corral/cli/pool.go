package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
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

// parseAnnotations turns KEY=VALUE flags into a map; nil when none.
func parseAnnotations(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usageErrorf("--annotation %q: want KEY=VALUE", kv)
		}
		if _, dup := out[k]; dup {
			return nil, usageErrorf("--annotation %q: key %q given twice", kv, k)
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
