package main

import (
	"fmt"

	"github.com/corralhq/corral/appliance"
	"github.com/spf13/cobra"
)

// addBMCFlags registers the BMC flags of `corrald serve`.
func addBMCFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Duration("bmc-poll-interval", 0, "how often every enrolled machine's power state is read, jittered ±10% (default 60s; negative disables) (env CORRAL_BMC_POLL_INTERVAL)")
	f.Int("bmc-poll-concurrency", 16, "BMCs polled at once (env CORRAL_BMC_POLL_CONCURRENCY)")
	f.Duration("bmc-timeout", 0, "bound on each BMC call (default 10s) (env CORRAL_BMC_TIMEOUT)")
	f.StringSlice("bmc-providers", nil, "BMC providers in the order tried: native-ipmi, ipmitool, gofish (default all three) (env CORRAL_BMC_PROVIDERS)")
}

// bmcConfig reads the BMC flags.
func bmcConfig(cmd *cobra.Command) (appliance.BMCConfig, error) {
	f := cmd.Flags()
	var c appliance.BMCConfig
	c.PollInterval, _ = f.GetDuration("bmc-poll-interval")
	c.PollConcurrency, _ = f.GetInt("bmc-poll-concurrency")
	c.CallTimeout, _ = f.GetDuration("bmc-timeout")
	c.Providers, _ = f.GetStringSlice("bmc-providers")
	if c.PollConcurrency < 1 {
		return c, fmt.Errorf("--bmc-poll-concurrency %d: must be at least 1", c.PollConcurrency)
	}
	if c.CallTimeout < 0 {
		return c, fmt.Errorf("--bmc-timeout %s: must not be negative", c.CallTimeout)
	}
	return c, nil
}
