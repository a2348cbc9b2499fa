package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/cobra"
)

// addWebFlags registers the web page flags.
func addWebFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("web-listen", "", `HTTPS listen address of the rack's web page, e.g. ":8443" (empty: off); it uses the API's certificate and tokens (env CORRAL_WEB_LISTEN)`)
	f.Int("web-max-conns", 256, "open connections the web page accepts (env CORRAL_WEB_MAX_CONNS)")
	f.Int("web-max-conns-per-ip", 64, "open web page connections from one address (env CORRAL_WEB_MAX_CONNS_PER_IP)")
}

// webConfig reads the web page flags (server validates them).
func webConfig(cmd *cobra.Command) appliance.WebConfig {
	f := cmd.Flags()
	var c appliance.WebConfig
	c.Listen, _ = f.GetString("web-listen")
	c.MaxConns, _ = f.GetInt("web-max-conns")
	c.MaxConnsPerIP, _ = f.GetInt("web-max-conns-per-ip")
	return c
}
