package main

import (
	"github.com/corralhq/corral/internal/server"
	"github.com/spf13/cobra"
)

// addWebFlags registers the web page flags.
func addWebFlags(cmd *cobra.Command) {}

// webConfig reads the web page flags.
func webConfig(cmd *cobra.Command) server.WebConfig { return server.WebConfig{} }
