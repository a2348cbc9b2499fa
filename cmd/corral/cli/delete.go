package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (inv *invocation) deleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete KIND NAME",
		Short: "Delete one resource",
		Long: `delete removes the record NAME of KIND and prints "<kind>/<name> deleted".
Block storages are soft-deleted, as in n0stack (undelete or purge them later).

Kinds: ` + kindList() + `.`,
		Args:              argsBetween(2, 2),
		ValidArgsFunction: inv.completeKindAndName(false),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			if err := k.del(ctx, cc, args[1]); err != nil {
				return inv.callError(k.subject(args[1]), err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted\n", k.name, args[1])
			return writeErr(err)
		},
	}
}
