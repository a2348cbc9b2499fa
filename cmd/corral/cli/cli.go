package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/flagconf"
	"github.com/corralhq/corral/internal/termsafe"
)

// DefaultTimeout bounds each RPC unless --timeout says otherwise.
const DefaultTimeout = 30 * time.Second

// App is one configured command line. The zero value is not usable: Run
// fills the defaults; tests build an App with their own Stdin, Getenv and
// Dial.
type App struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment (the global flags' CORRAL_CONFIG,
	// CORRAL_ENDPOINT, CORRAL_TOKEN, CORRAL_TIMEOUT, and HOME). Nil means
	// the process's environment.
	Getenv func(string) string
	// Dial connects to cfg.Endpoint. It must not block on I/O. Nil means
	// clientconfig.Dial (TLS trusting cfg.CACert, bearer cfg.Token).
	Dial func(cfg *clientconfig.Config) (*grpc.ClientConn, error)
}

// Run executes the command line args (without the program name) with the
// process's stdin, writing results to stdout and the single error line to
// stderr, and returns the exit code. It stops waiting on RPCs when ctx is
// cancelled.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return (&App{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr}).Run(ctx, args)
}

// Run executes args like the package-level Run, using a's streams,
// environment and dialer.
func (a *App) Run(ctx context.Context, args []string) int {
	inv := &invocation{app: a}
	defer inv.close()

	root := inv.rootCommand()
	if args == nil {
		args = []string{} // cobra would read os.Args otherwise
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintf(a.stderr(), "corral: %s\n", oneLine(ee.msg))
		return ee.code
	}
	// Errors produced by cobra itself: unknown commands, missing required
	// flags. They are all usage errors.
	path := "corral"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(a.stderr(), "corral: %s (see '%s --help')\n", oneLine(err.Error()), path)
	return ExitUsage
}

// stdout and stderr are the only way to the caller's streams: they escape
// every control character but newline, tab and carriage return
// (internal/termsafe), so no printer can put a string from the boot LAN —
// a fact, a DHCP option, a TFTP file name — on the operator's terminal
// raw. -o json keeps its meaning: the escapes of what JSON leaves raw (DEL,
// C1, bidi overrides) are JSON escapes.
func (a *App) stdout() io.Writer {
	if a.Stdout == nil {
		return io.Discard
	}
	return termsafe.Writer(a.Stdout)
}

func (a *App) stderr() io.Writer { return termsafe.Writer(a.rawStderr()) }

// rawStderr is stderr unescaped, for the progress line of a long command
// (its own text; it must see the terminal to know it is one).
func (a *App) rawStderr() io.Writer {
	if a.Stderr == nil {
		return io.Discard
	}
	return a.Stderr
}

func (a *App) stdin() io.Reader {
	if a.Stdin == nil {
		return strings.NewReader("")
	}
	return a.Stdin
}

func (a *App) getenv(key string) string {
	if a.Getenv == nil {
		return os.Getenv(key)
	}
	return a.Getenv(key)
}

// environ is the environment the global flags read: the process's, or
// with Getenv set the global flags' variables as Getenv answers them.
func (a *App) environ(fs *pflag.FlagSet) func() []string {
	if a.Getenv == nil {
		return nil
	}
	return func() []string {
		var env []string
		fs.VisitAll(func(f *pflag.Flag) {
			name := flagconf.EnvName(f.Name)
			if v := a.Getenv(name); v != "" {
				env = append(env, name+"="+v)
			}
		})
		return env
	}
}

// invocation is the state of one Run: global flag values and the
// connection, dialled on first use and closed when Run returns.
type invocation struct {
	app *App

	configPath  string
	contextName string
	endpoint    string
	token       string
	timeout     time.Duration

	conn       *grpc.ClientConn
	connTarget string // endpoint the connection was made to, for messages
}

func (inv *invocation) close() {
	if inv.conn != nil {
		_ = inv.conn.Close()
	}
}

func (inv *invocation) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "corral VERB",
		Short: "Command-line client of the corrald bare-metal appliance",
		Long: `corral talks to corrald over gRPC (TLS and a bearer token).

Kinds: ` + kindList() + `.

The connection comes from the client configuration file (--config, else
~/.config/corral/config.yaml): its current context, or the one --context
names (see 'corral config'); --endpoint and --token override its endpoint
and token. A global flag not given is read from CORRAL_<FLAG> (CORRAL_CONFIG,
CORRAL_CONTEXT, CORRAL_ENDPOINT, CORRAL_TOKEN, CORRAL_TIMEOUT); the command
line wins.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("missing verb (see 'corral --help')")
			}
			return usageErrorf("unknown verb %q%s (valid: %s)", args[0], didYouMean(cmd, args[0]), verbList(cmd))
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		// cobra adds `corral completion bash|zsh|fish|powershell`; resource
		// names come from the verbs' ValidArgsFunction (completion.go).
	}
	root.SetOut(inv.app.stdout())
	root.SetErr(inv.app.stderr())
	root.SetIn(inv.app.stdin())
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageErrorf("%v (see '%s --help')", err, cmd.CommandPath())
	})

	pf := root.PersistentFlags()
	pf.StringVar(&inv.configPath, "config", "", "client configuration file (env CORRAL_CONFIG, default ~/.config/corral/config.yaml)")
	pf.StringVar(&inv.contextName, "context", "", "context of the configuration file to use instead of its current one (env CORRAL_CONTEXT)")
	pf.StringVar(&inv.endpoint, "endpoint", "", "corrald address host:port, overriding the configuration file (env CORRAL_ENDPOINT)")
	pf.StringVar(&inv.token, "token", "", "bearer token, overriding the configuration file (env CORRAL_TOKEN)")
	pf.DurationVar(&inv.timeout, "timeout", DefaultTimeout, "deadline of each RPC (env CORRAL_TIMEOUT)")
	// Only the global flags read the environment: a verb's own flags
	// (--name, --node, -o) are per call.
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if err := flagconf.Apply(pf, flagconf.Options{Environ: inv.app.environ(pf)}); err != nil {
			return usageErrorf("%v", err)
		}
		return nil
	}

	root.AddCommand(
		inv.getCommand(),
		inv.describeCommand(),
		inv.applyCommand(),
		inv.doCommand(),
		inv.deleteCommand(),
		inv.nodeCommand(),
		inv.networkCommand(),
		inv.machineCommand(),
		inv.labelCommand(),
		inv.vmCommand(),
		inv.bsCommand(),
		inv.imageCommand(),
		inv.osImageCommand(),
		inv.standbyPoolCommand(),
		inv.tokenCommand(),
		inv.webhookCommand(),
		inv.backupCommand(),
		inv.versionCommand(),
		inv.configCommand(),
	)
	groups := map[string]*kind{
		"machine": machineKind, "vm": virtualMachineKind, "bs": blockStorageKind,
		"image": imageKind, "node": nodeKind, "network": networkKind, "osimage": osImageKind,
	}
	for _, c := range root.Commands() {
		if k, ok := groups[c.Name()]; ok {
			inv.addCompletions(c, k)
		}
	}
	return root
}

// verbList names the subcommands of cmd for error messages.
func verbList(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// groupRunE is the RunE of a command that only holds subcommands (node,
// network): it turns a missing or unknown verb into a usage error instead
// of cobra's silent help.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usageErrorf("missing %s verb (valid: %s)", cmd.Name(), verbList(cmd))
	}
	return usageErrorf("unknown %s verb %q%s (valid: %s)", cmd.Name(), args[0], didYouMean(cmd, args[0]), verbList(cmd))
}

// didYouMean is cobra's suggestion for a mistyped subcommand of cmd (by
// edit distance, prefix and SuggestFor), as `; did you mean "get"?`, or "".
func didYouMean(cmd *cobra.Command, typed string) string {
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default
	}
	s := cmd.SuggestionsFor(typed)
	if len(s) == 0 {
		return ""
	}
	q := make([]string, len(s))
	for i, w := range s {
		q[i] = strconv.Quote(w)
	}
	return "; did you mean " + strings.Join(q, " or ") + "?"
}

// argsBetween is a cobra.PositionalArgs that reports a wrong argument
// count as a usage error quoting the command's usage line.
func argsBetween(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageErrorf("wrong number of arguments: usage: %s", cmd.UseLine())
		}
		return nil
	}
}

// callContext returns the context of one RPC: the command's context
// bounded by --timeout.
func (inv *invocation) callContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), inv.timeout)
}

// rpc connects, runs call under the per-RPC deadline, and turns its error
// into the one-line message about subject. It is the envelope of every verb
// that makes one call.
func (inv *invocation) rpc(cmd *cobra.Command, subject string, call func(ctx context.Context, cc *grpc.ClientConn) error) error {
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	ctx, cancel := inv.callContext(cmd)
	defer cancel()
	if err := call(ctx, cc); err != nil {
		return inv.callError(subject, err)
	}
	return nil
}
