package main

import (
	"fmt"
	"io"
	"log/slog"

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
	root.PersistentFlags().String("data-dir", "/var/lib/corral", "data directory (env CORRAL_DATA_DIR)")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error (env CORRAL_LOG_LEVEL)")
	root.PersistentFlags().String("log-format", "text", "log format: text or json (env CORRAL_LOG_FORMAT)")
	// Every command's flags (its own and the persistent ones) read the
	// environment; serve's also read its --config file.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return flagconf.Apply(cmd.Flags(), flagconf.Options{FileFlag: "config"})
	}
	root.AddCommand(newServeCmd(serve), newTokenCmd(), newImagesCmd(), newStoreCmd(), newRestoreCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "corrald", version) },
	})
	return root
}

func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	levelName, _ := cmd.Flags().GetString("log-level")
	format, _ := cmd.Flags().GetString("log-format")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", levelName)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
