package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the CLI's version; release builds set it with
// -ldflags "-X github.com/corralhq/corral/cmd/corral/cli.Version=v1.2.3".
var Version = "dev"

func (inv *invocation) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this corral binary",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionString())
			return writeErr(err)
		},
	}
}

// versionString is "corral <version> (<go version>[, rev <commit>[+dirty]])".
func versionString() string {
	v, rev := Version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
	}
	s := fmt.Sprintf("corral %s (%s", v, runtime.Version())
	if rev != "" {
		s += ", rev " + rev
	}
	return s + ")"
}
