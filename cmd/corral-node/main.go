// Command corral-node is the agent that runs on machines: `discover` in the
// discovery initramfs (as the u-root uinit) and `hypervisor` on installed
// nodes. Nothing it imports may reach bbolt, etcd, bmclib or
// Corral's store/, ipmi/ or boot/ (see guards_test.go at the module root).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/corralhq/corral/agent/discover"
	"github.com/corralhq/corral/internal/flagconf"
	"github.com/spf13/pflag"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-node: %v\n", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "corral-node", version)
		return nil
	}
	switch args[0] {
	case "discover":
		return runDiscover(ctx, args[1:], stdout, stderr)
	case "hypervisor":
		return runHypervisor(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown command %q (commands: discover, hypervisor, version)", args[0])
}

func runDiscover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("discover", stderr)
	root := fs.String("root", "/", "read sysfs, procfs and SMBIOS under this directory")
	dryRun := fs.Bool("dry-run", false, "print the facts as JSON and exit; load nothing, touch no network")
	cmdlineFile := fs.String("cmdline", "/proc/cmdline", "kernel command line carrying corral.* parameters")
	caFile := fs.String("ca-file", "/etc/corral/ca.crt", "optional PEM with CA candidates (only one matching corral.ca is trusted)")
	verbose := fs.BoolP("verbose", "v", false, "debug logging on stderr")
	if err := parse(fs, args, nil); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	console := consoleWriter(stdout)
	return discover.Run(ctx, discover.Config{
		Root: *root, CmdlineFile: *cmdlineFile, CAFile: *caFile, DryRun: *dryRun,
		Version: version, Stdout: stdout, Console: console, Logger: logger,
	})
}

// newFlagSet is a subcommand's flag set: POSIX long flags, usage and
// errors on stderr.
func newFlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of corral-node %s (a flag not given is read from CORRAL_<NAME>, upper case, '-' as '_'):\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args, then fills the flags not given from the
// environment (flagconf; aliases: older variable names).
func parse(fs *pflag.FlagSet, args []string, aliases map[string][]string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	return flagconf.Apply(fs, flagconf.Options{Aliases: aliases})
}

// consoleWriter writes to stdout and, when it is a different file, to
// /dev/console, so an operator at the machine's screen or serial line sees
// why discovery is stuck.
func consoleWriter(stdout io.Writer) io.Writer {
	c, err := os.OpenFile("/dev/console", os.O_WRONLY|syscall.O_NOCTTY, 0)
	if err != nil {
		return stdout
	}
	if f, ok := stdout.(*os.File); ok {
		a, errA := f.Stat()
		b, errB := c.Stat()
		// The same file, or stdout already a terminal (under u-root the
		// init's stdout is the console's tty, a different inode from
		// /dev/console): writing both would print every line twice.
		if errA == nil && errB == nil && (os.SameFile(a, b) || a.Mode()&os.ModeCharDevice != 0) {
			c.Close()
			return stdout
		}
	}
	return io.MultiWriter(stdout, c)
}
