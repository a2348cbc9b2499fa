// Command corral is the command-line client of the corrald appliance: it
// lists, describes, applies and deletes pool, provisioning, image and
// inventory resources over gRPC. All logic lives in package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/corralhq/corral/cmd/corral/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
