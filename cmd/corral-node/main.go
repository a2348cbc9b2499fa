// Command corral-node is the agent that runs on machines: `discover` in the
// discovery initramfs and `hypervisor` on installed nodes. For now it only
// prints its version. Nothing it imports may reach bbolt, etcd, bmclib or
// Corral's store/, ipmi/ or boot/ (see guards_test.go at the module root).
package main

import (
	"fmt"
	"io"
	"os"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "corral-node: %v\n", err)
		os.Exit(2)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "corral-node", version)
		return nil
	}
	return fmt.Errorf("unknown command %q (this build only knows `version`)", args[0])
}
