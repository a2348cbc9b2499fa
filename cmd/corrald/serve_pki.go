package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/spf13/cobra"
)

// addPKIFlags registers the certificate flags of `corrald serve`.
func addPKIFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Duration("node-cert-validity", pki.NodeValidity, "lifetime of node certificates; nodes renew at two thirds of it (env CORRAL_NODE_CERT_VALIDITY)")
	f.Duration("appliance-client-cert-validity", appliance.DefaultApplianceClientCertValidity, "lifetime of the certificate the appliance presents to nodes, renewed in memory at two thirds of it (env CORRAL_APPLIANCE_CLIENT_CERT_VALIDITY)")
	f.Int("max-live-node-certs", auth.DefaultMaxLiveCerts, "unexpired certificates kept per node name; issuing one more revokes the oldest (env CORRAL_MAX_LIVE_NODE_CERTS)")
	f.Duration("revocation-purge-interval", 0, "how often revocation records of expired certificates are deleted (default 1h) (env CORRAL_REVOCATION_PURGE_INTERVAL)")
}

// pkiConfig reads the certificate flags (server validates them).
func pkiConfig(cmd *cobra.Command) appliance.PKIConfig {
	f := cmd.Flags()
	var c appliance.PKIConfig
	c.NodeCertValidity, _ = f.GetDuration("node-cert-validity")
	c.ApplianceClientCertValidity, _ = f.GetDuration("appliance-client-cert-validity")
	c.MaxLiveNodeCerts, _ = f.GetInt("max-live-node-certs")
	c.RevocationPurgeInterval, _ = f.GetDuration("revocation-purge-interval")
	return c
}
