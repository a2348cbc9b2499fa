package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "corrald",
		Short:         "Corral bare-metal provisioning appliance",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().String("data-dir", "/var/lib/corral", "data directory (env CORRAL_DATA_DIR)")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error (env CORRAL_LOG_LEVEL)")
	root.PersistentFlags().String("log-format", "text", "log format: text or json (env CORRAL_LOG_FORMAT)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return applyEnv(cmd.Flags())
	}
	root.AddCommand(newServeCmd(), newTokenCmd(), newImagesCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "corrald", version) },
	})
	return root
}

// applyEnv gives every flag a CORRAL_<FLAG_NAME> environment fallback: the
// environment applies only when the flag was not set on the command line.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		env := "CORRAL_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if f.Value.Type() == "stringSlice" || f.Value.Type() == "stringArray" {
			for _, part := range strings.Split(v, ",") {
				if part = strings.TrimSpace(part); part != "" {
					if e := fs.Set(f.Name, part); e != nil {
						err = fmt.Errorf("%s=%q: %w", env, v, e)
						return
					}
				}
			}
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("%s=%q: %w", env, v, e)
		}
	})
	return err
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
