package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/cobra"
)

// defaultMetricsListen is --metrics-listen's default.
const defaultMetricsListen = ":9180"

// addMetricsFlags registers the metrics and health flags.
func addMetricsFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("metrics-listen", defaultMetricsListen, `plain-HTTP address of /metrics (Prometheus), /healthz and /readyz; "" turns it off. It carries no secrets and no per-machine labels (env CORRAL_METRICS_LISTEN)`)
	f.Duration("health-interval", 0, "how often the store is checked for gRPC health and the systemd watchdog (default 5s, at most half of WATCHDOG_USEC) (env CORRAL_HEALTH_INTERVAL)")
}

// metricsConfig reads the metrics and health flags.
func metricsConfig(cmd *cobra.Command) appliance.MetricsConfig {
	f := cmd.Flags()
	var c appliance.MetricsConfig
	c.Listen, _ = f.GetString("metrics-listen")
	c.ListenIsDefault = !f.Changed("metrics-listen")
	c.HealthInterval, _ = f.GetDuration("health-interval")
	return c
}
