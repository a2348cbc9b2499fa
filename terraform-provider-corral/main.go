// Command terraform-provider-corral is the Terraform/OpenTofu provider for
// a Corral appliance: networks, block storage and virtual machines on its
// node pool, and read-only views of its machines and nodes, over corrald's
// gRPC API (the api module's client). Terraform or OpenTofu starts it as a
// plugin; run by hand it only says so. See README.md.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"github.com/corralhq/corral/terraform-provider-corral/internal/provider"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	debug := flag.Bool("debug", false, "run for a debugger (prints TF_REATTACH_PROVIDERS)")
	flag.Parse()
	err := providerserver.Serve(context.Background(), provider.New(version), providerserver.ServeOpts{
		Address: provider.Address,
		Debug:   *debug,
	})
	if err != nil {
		log.Fatal(err)
	}
}
