package main

import (
	"github.com/corralhq/corral/cmd/corrald/server"
	"github.com/spf13/cobra"
)

// addBMCFlags registers the BMC flags of `corrald serve`.
func addBMCFlags(cmd *cobra.Command) {}

// bmcConfig reads the BMC flags.
func bmcConfig(cmd *cobra.Command) (server.BMCConfig, error) { return server.BMCConfig{}, nil }
