package cli

import (
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

func (inv *invocation) getCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get KIND [NAME]",
		Short: "List records of a kind, or show one",
		Long: `get lists every record of KIND, or only NAME, as a table (default), JSON
or YAML. JSON and YAML use proto field names; a list is an array.

Kinds: ` + kindList() + `.`,
		Args: argsBetween(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			k, err := kindArg(args[0])
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
			ms, err := k.list(ctx, cc)
			if err != nil {
				return inv.callError("list "+k.name+"s", err)
			}
			sortByName(ms)
			return printRecords(cmd.OutOrStdout(), k, ms, true, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
