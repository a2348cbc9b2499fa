package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/spf13/pflag"
)

// addPKIFlags registers the certificate flags of `corrald serve` (server
// validates them).
func addPKIFlags(f *pflag.FlagSet, c *appliance.PKIConfig) {
	f.DurationVar(&c.NodeCertValidity, "node-cert-validity", pki.NodeValidity, "lifetime of node certificates; nodes renew at two thirds of it (env CORRAL_NODE_CERT_VALIDITY)")
	f.DurationVar(&c.ApplianceClientCertValidity, "appliance-client-cert-validity", appliance.DefaultApplianceClientCertValidity, "lifetime of the certificate the appliance presents to nodes, renewed in memory at two thirds of it (env CORRAL_APPLIANCE_CLIENT_CERT_VALIDITY)")
	f.IntVar(&c.MaxLiveNodeCerts, "max-live-node-certs", auth.DefaultMaxLiveCerts, "unexpired certificates kept per node name; issuing one more revokes the oldest (env CORRAL_MAX_LIVE_NODE_CERTS)")
	f.DurationVar(&c.RevocationPurgeInterval, "revocation-purge-interval", 0, "how often revocation records of expired certificates are deleted (default 1h) (env CORRAL_REVOCATION_PURGE_INTERVAL)")
}
