package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/pflag"
)

// defaultMetricsListen is --metrics-listen's default.
const defaultMetricsListen = ":9180"

// addMetricsFlags registers the metrics and health flags
// (ListenIsDefault is set by serveConfig).
func addMetricsFlags(f *pflag.FlagSet, c *appliance.MetricsConfig) {
	f.StringVar(&c.Listen, "metrics-listen", defaultMetricsListen, `plain-HTTP address of /metrics (Prometheus), /healthz and /readyz; "" turns it off. It carries no secrets and no per-machine labels (env CORRAL_METRICS_LISTEN)`)
	f.DurationVar(&c.HealthInterval, "health-interval", 0, "how often the store is checked for gRPC health and the systemd watchdog (default 5s, at most half of WATCHDOG_USEC) (env CORRAL_HEALTH_INTERVAL)")
}
