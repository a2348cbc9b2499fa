package main

import (
	"github.com/corralhq/corral/internal/server"
	"github.com/spf13/cobra"
)

// addMetricsFlags registers the metrics and health flags.
func addMetricsFlags(cmd *cobra.Command) {}

// metricsConfig reads the metrics and health flags.
func metricsConfig(cmd *cobra.Command) server.MetricsConfig { return server.MetricsConfig{} }
