package cli

import (
	"google.golang.org/grpc"

	"context"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

func (inv *invocation) describeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "describe KIND NAME",
		Short: "Show the full record of one resource as YAML",
		Long: `describe prints every populated field of one record as YAML, with proto
field names (the same as 'get KIND NAME -o yaml').

Kinds: ` + kindList() + `.`,
		Args:              argsBetween(2, 2),
		ValidArgsFunction: inv.completeKindAndName(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := kindArg(args[0])
			if err != nil {
				return err
			}
			var m proto.Message
			if err := inv.rpc(cmd, k.subject(args[1]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				m, err = k.get(ctx, cc, args[1])
				return err
			}); err != nil {
				return err
			}
			if err := printRecords(cmd.OutOrStdout(), k, []proto.Message{m}, false, formatYAML); err != nil {
				return err
			}
			if err := describeNotes(cmd.OutOrStdout(), m); err != nil {
				return err
			}
			if err := lldpNotes(cmd.OutOrStdout(), m); err != nil { // machine_lldp.go
				return err
			}
			return deployNotes(cmd.OutOrStdout(), m)
		},
	}
}
