package main

import (
	"fmt"
	"net/url"

	"github.com/corralhq/corral/appliance"
	"github.com/spf13/pflag"
)

// addBMCFlags registers the BMC flags of `corrald serve`.
func addBMCFlags(f *pflag.FlagSet, c *appliance.BMCConfig) {
	f.DurationVar(&c.PollInterval, "bmc-poll-interval", 0, "how often every enrolled machine's power state is read, jittered ±10% (default 60s; negative disables) (env CORRAL_BMC_POLL_INTERVAL)")
	f.IntVar(&c.PollConcurrency, "bmc-poll-concurrency", 16, "BMCs polled at once (env CORRAL_BMC_POLL_CONCURRENCY)")
	f.DurationVar(&c.CallTimeout, "bmc-timeout", 0, "bound on each BMC call (default 10s) (env CORRAL_BMC_TIMEOUT)")
	f.DurationVar(&c.HealthInterval, "bmc-health-interval", 0, "how often every enrolled machine's BMC sensors and event log are read, jittered ±10% (default 5m; negative disables) (env CORRAL_BMC_HEALTH_INTERVAL)")
	f.IntVar(&c.HealthSensors, "bmc-health-sensors", 64, "sensors kept per machine; the rest are counted as dropped (env CORRAL_BMC_HEALTH_SENSORS)")
	f.DurationVar(&c.RotateEvery, "bmc-rotate-every", 0, "rotate the password of each BMC account Corral owns (corral machine bmc rotate) when older than this (0: never) (env CORRAL_BMC_ROTATE_EVERY)")
	f.StringVar(&c.MediaURL, "bmc-media-url", "", "the boot HTTP server's URL as BMCs reach it, for Redfish firmware updates and virtual media (default: the boot HTTP address when it is a specific one) (env CORRAL_BMC_MEDIA_URL)")
	f.StringSliceVar(&c.Providers, "bmc-providers", nil, "BMC providers in the order tried: native-ipmi, ipmitool, gofish (default all three) (env CORRAL_BMC_PROVIDERS)")
}

// checkBMCConfig checks the BMC settings.
func checkBMCConfig(c appliance.BMCConfig) error {
	if c.PollConcurrency < 1 {
		return fmt.Errorf("--bmc-poll-concurrency %d: must be at least 1", c.PollConcurrency)
	}
	if c.HealthSensors < 0 {
		return fmt.Errorf("--bmc-health-sensors %d: must not be negative (0: 64)", c.HealthSensors)
	}
	if c.RotateEvery < 0 {
		return fmt.Errorf("--bmc-rotate-every %s: must not be negative", c.RotateEvery)
	}
	if c.MediaURL != "" {
		u, err := url.Parse(c.MediaURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("--bmc-media-url %.200q: want http://HOST[:PORT] or https://HOST[:PORT], no query", c.MediaURL)
		}
	}
	if c.CallTimeout < 0 {
		return fmt.Errorf("--bmc-timeout %s: must not be negative", c.CallTimeout)
	}
	return nil
}
