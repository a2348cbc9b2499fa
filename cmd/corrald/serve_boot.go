package main

import (
	"github.com/corralhq/corral/cmd/corrald/server"
	"github.com/spf13/cobra"
)

// addBootFlags registers the network-boot flags of `corrald serve`.
func addBootFlags(cmd *cobra.Command) {}

// bootConfig reads the network-boot flags.
func bootConfig(cmd *cobra.Command) (server.BootConfig, error) { return server.BootConfig{}, nil }
