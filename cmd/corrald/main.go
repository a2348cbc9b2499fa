// Command corrald is the Corral appliance daemon: `corrald serve` serves the
// API; `corrald token create` mints tokens offline against the data dir.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "corrald: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr, runServer)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}
