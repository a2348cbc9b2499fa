package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/pflag"
)

// addWebFlags registers the web page flags (server validates them).
func addWebFlags(f *pflag.FlagSet, c *appliance.WebConfig) {
	f.StringVar(&c.Listen, "web-listen", "", `HTTPS listen address of the rack's web page, e.g. ":8443" (empty: off); it uses the API's certificate and tokens (env CORRAL_WEB_LISTEN)`)
	f.IntVar(&c.MaxConns, "web-max-conns", 256, "open connections the web page accepts (env CORRAL_WEB_MAX_CONNS)")
	f.IntVar(&c.MaxConnsPerIP, "web-max-conns-per-ip", 64, "open web page connections from one address (env CORRAL_WEB_MAX_CONNS_PER_IP)")
}
