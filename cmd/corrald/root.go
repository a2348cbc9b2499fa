package main

import (
	"fmt"
	"io"

	"github.com/corralhq/corral/internal/flagconf"
	"github.com/spf13/cobra"
)

// newRootCmd is corrald's command tree; serve runs `corrald serve`.
func newRootCmd(stdout, stderr io.Writer, serve serveFunc) *cobra.Command {
	root := &cobra.Command{
		Use:   "corrald",
		Short: "Corral bare-metal provisioning appliance",
		Long: `Corral bare-metal provisioning appliance.

A flag not given on the command line is read from CORRAL_<FLAG> (upper case,
'-' as '_', e.g. --data-dir from CORRAL_DATA_DIR), then, for corrald serve,
from the YAML file named by --config; see corrald serve --help.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	g := &globals{}
	g.bind(root.PersistentFlags())
	// Every command's flags (its own and the persistent ones) read the
	// environment; serve's also read its --config file. Enum-valued
	// settings are checked here, before any command opens or writes
	// anything.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := flagconf.Apply(cmd.Flags(), flagconf.Options{FileFlag: "config"}); err != nil {
			return err
		}
		return g.check()
	}
	root.AddCommand(newServeCmd(g, serve), newTokenCmd(g), newImagesCmd(g), newStoreCmd(g), newRestoreCmd(g), newBootCACmd(g), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "corrald", version) },
	})
	return root
}
