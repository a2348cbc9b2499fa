package main

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/corralhq/corral/internal/flagconf"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flags are bound to fields of typed configuration where they are
// defined (pflag's StringVar and kin): a command reads its settings from
// those fields, never by flag name, so a misspelt name cannot compile.
// flagconf fills the same flags from the environment and --config before
// the command runs.

// globals are the persistent flags of every corrald command.
type globals struct {
	dataDir   string
	logLevel  string
	logFormat string
}

// bind registers the persistent flags on fs.
func (g *globals) bind(fs *pflag.FlagSet) {
	fs.StringVar(&g.dataDir, "data-dir", "/var/lib/corral", "data directory (env CORRAL_DATA_DIR)")
	fs.StringVar(&g.logLevel, "log-level", "info", "log level: "+strings.Join(logLevels, ", ")+" (env CORRAL_LOG_LEVEL)")
	fs.StringVar(&g.logFormat, "log-format", "text", "log format: "+strings.Join(logFormats, " or ")+" (env CORRAL_LOG_FORMAT)")
}

var (
	logLevels  = []string{"debug", "info", "warn", "error"}
	logFormats = []string{"text", "json"}
)

// check validates the enum-valued global settings.
func (g *globals) check() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return enumError("log-level", g.logLevel, logLevels)
	}
	return checkEnum("log-format", g.logFormat, logFormats)
}

// logger is the logger the global flags ask for, writing to w. Its lines
// go through termsafe.Writer: the text handler quotes a value holding a
// control character, the JSON handler leaves DEL, C1 and the bidi
// overrides raw, and a log is read on a terminal (journalctl) with strings
// from the boot LAN in it (a TFTP file name, an HTTP path).
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	w = termsafe.Writer(w)
	if err := g.check(); err != nil {
		return nil, err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(g.logLevel))
	opts := &slog.HandlerOptions{Level: level}
	if g.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// checkEnum refuses a value of the setting (a flag name, which is also its
// --config key and, as CORRAL_<NAME>, its environment variable) that is
// not one of allowed.
func checkEnum(setting, value string, allowed []string) error {
	if slices.Contains(allowed, value) {
		return nil
	}
	return enumError(setting, value, allowed)
}

func enumError(setting, value string, allowed []string) error {
	return fmt.Errorf("%s %q: want one of %s (set by --%s, %s or the --config key %s)",
		setting, value, strings.Join(allowed, ", "), setting, flagconf.EnvName(setting), setting)
}

// flagGroups are the titled blocks of a command's help: each group is a
// FlagSet whose flags are also added to the command.
type flagGroups struct {
	titles []string
	sets   map[string]*pflag.FlagSet
}

// set returns the group titled title, creating it (in order) on first use.
func (g *flagGroups) set(title string) *pflag.FlagSet {
	if g.sets == nil {
		g.sets = map[string]*pflag.FlagSet{}
	}
	fs, ok := g.sets[title]
	if !ok {
		fs = pflag.NewFlagSet(title, pflag.ContinueOnError)
		g.sets[title] = fs
		g.titles = append(g.titles, title)
	}
	return fs
}

// install adds every group's flags to cmd and makes cmd's usage print them
// group by group; a local flag in no group (--help) goes to the first.
func (g *flagGroups) install(cmd *cobra.Command) {
	for _, t := range g.titles {
		cmd.Flags().AddFlagSet(g.sets[t])
	}
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		w := c.OutOrStderr()
		fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
		grouped := map[string]bool{}
		for _, fs := range g.sets {
			fs.VisitAll(func(f *pflag.Flag) { grouped[f.Name] = true })
		}
		for i, t := range g.titles {
			fs := pflag.NewFlagSet(t, pflag.ContinueOnError)
			fs.AddFlagSet(g.sets[t])
			if i == 0 {
				c.LocalFlags().VisitAll(func(f *pflag.Flag) {
					if !grouped[f.Name] {
						fs.AddFlag(f)
					}
				})
			}
			fmt.Fprintf(w, "\n%s:\n%s", t, fs.FlagUsages())
		}
		if c.HasAvailableInheritedFlags() {
			fmt.Fprintf(w, "\nGlobal flags:\n%s", c.InheritedFlags().FlagUsages())
		}
		return nil
	})
}
