package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/api/clientconfig"
)

// maxSecretFile bounds the CA and token files set-context reads.
const maxSecretFile = 1 << 20

// configCommand groups the verbs that edit the client configuration file's
// contexts. None of them connects to corrald.
func (inv *invocation) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config VERB",
		Short: "Client configuration: named contexts (appliances) and the current one",
		Long: `config edits the client configuration file (--config, else
~/.config/corral/config.yaml). The file's top-level endpoint, ca_cert and
token are the context "default" (corrald's admin.conf is such a file); more
appliances are added as named contexts, and current_context says which one
every verb uses unless --context names another.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(
		inv.getContextsCommand(),
		inv.currentContextCommand(),
		inv.useContextCommand(),
		inv.setContextCommand(),
	)
	return cmd
}

// loadContexts reads the configuration file the config verbs edit. A
// missing file is an error unless create, then an empty File.
func (inv *invocation) loadContexts(cmd *cobra.Command, create bool) (*clientconfig.File, string, error) {
	path, _ := inv.configPathFor(cmd.Flags())
	if path == "" {
		return nil, "", usageErrorf("no configuration file: pass --config or set HOME")
	}
	f, err := clientconfig.LoadFile(path)
	switch {
	case err == nil:
		return f, path, nil
	case create && errors.Is(err, fs.ErrNotExist):
		return &clientconfig.File{}, path, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, "", failf("no configuration file %s (create one with 'corral config set-context NAME --endpoint HOST:PORT')", path)
	}
	return nil, "", failf("%v", err)
}

func (inv *invocation) getContextsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts of the configuration file (never their tokens)",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, _, err := inv.loadContexts(cmd, false)
			if err != nil {
				return err
			}
			var rows [][]string
			for _, c := range f.List() {
				cur, ca, tok := "", "system", "-"
				if c.Current {
					cur = "*"
				}
				if c.HasCA {
					ca = "pinned"
				}
				if c.HasToken {
					tok = "set"
				}
				rows = append(rows, []string{cur, c.Name, c.Endpoint, ca, tok})
			}
			return writeErr(writeList(cmd.OutOrStdout(), "contexts", []string{"CURRENT", "NAME", "ENDPOINT", "CA", "TOKEN"}, rows))
		},
	}
}

func (inv *invocation) currentContextCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "current-context",
		Short: "Print the name of the current context",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, path, err := inv.loadContexts(cmd, false)
			if err != nil {
				return err
			}
			cur := f.Current()
			if cur == "" {
				_, err := f.Context("")
				return failf("%s: %v", path, err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), cur)
			return writeErr(err)
		},
	}
}

func (inv *invocation) useContextCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "use-context NAME",
		Short:             "Make NAME the context every verb uses",
		Args:              argsBetween(1, 1),
		ValidArgsFunction: inv.completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, path, err := inv.loadContexts(cmd, false)
			if err != nil {
				return err
			}
			if err := f.UseContext(args[0]); err != nil {
				return usageErrorf("%s: %v", path, err)
			}
			if err := f.Write(path); err != nil {
				return failf("%v", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "switched to context %q\n", args[0])
			return writeErr(err)
		},
	}
}

func (inv *invocation) setContextCommand() *cobra.Command {
	var endpoint, caFile, tokenFile string
	var use bool
	cmd := &cobra.Command{
		Use:   "set-context NAME [--endpoint HOST:PORT] [--ca-file FILE] [--token-file FILE]",
		Short: "Create or change a context (\"default\" is the file's top-level connection)",
		Long: `set-context creates the context NAME, or changes the fields given of an
existing one. The CA certificate (PEM) and the token are read from files and
stored in the configuration file, which is written with mode 0600 (and
created, with its directory, when missing). --use also makes NAME current.`,
		Args:              argsBetween(1, 1),
		ValidArgsFunction: inv.completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			f, path, err := inv.loadContexts(cmd, true)
			if err != nil {
				return err
			}
			var c clientconfig.Config
			existing, lerr := f.Context(name)
			if lerr == nil {
				c = *existing
			} else if !cmd.Flags().Changed("endpoint") {
				return usageErrorf("context %q is new: --endpoint is required", name)
			}
			if cmd.Flags().Changed("endpoint") {
				c.Endpoint = withDefaultPort(strings.TrimSpace(endpoint))
			}
			if cmd.Flags().Changed("ca-file") {
				if c.CACert, err = readSmallFile(caFile); err != nil {
					return fileErrorf("--ca-file", err)
				}
			}
			if cmd.Flags().Changed("token-file") {
				tok, err := readSmallFile(tokenFile)
				if err != nil {
					return fileErrorf("--token-file", err)
				}
				c.Token = strings.TrimSpace(tok)
			}
			if err := f.SetContext(name, c); err != nil {
				return usageErrorf("%v", err)
			}
			if use {
				if err := f.UseContext(name); err != nil {
					return usageErrorf("%v", err)
				}
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return failf("config %s: %v", path, err)
			}
			if err := f.Write(path); err != nil {
				return failf("%v", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "context %q set in %s\n", name, path)
			return writeErr(err)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&endpoint, "endpoint", "", "corrald address host:port (required for a new context)")
	fs.StringVar(&caFile, "ca-file", "", "PEM file of the appliance CA to trust (empty: the system trust store)")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the bearer token")
	fs.BoolVar(&use, "use", false, "also make NAME the current context")
	return cmd
}

// readSmallFile reads a file of at most maxSecretFile bytes; an empty
// path reads as empty (clearing the field).
func readSmallFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes", path, maxSecretFile)
	}
	return string(b), nil
}

// completeContexts completes context names from the configuration file.
func (inv *invocation) completeContexts(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	path, _ := inv.configPathFor(cmd.Flags())
	if path == "" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	f, err := clientconfig.LoadFile(path)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return f.Names(), cobra.ShellCompDirectiveNoFileComp
}
