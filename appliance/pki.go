package appliance

import (
	"context"
	"fmt"
	"time"

	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/inventory"
)

// PKIConfig configures node certificates and the appliance's client
// certificate. Zero values take the defaults.
type PKIConfig struct {
	// NodeCertValidity is the lifetime of node certificates (default
	// pki.NodeValidity, 90 days); nodes renew at two thirds of it.
	NodeCertValidity time.Duration
	// ApplianceClientCertValidity is the lifetime of the certificate the
	// appliance presents to nodes (default 30 days); it is renewed in
	// memory at two thirds of it.
	ApplianceClientCertValidity time.Duration
	// MaxLiveNodeCerts bounds the unexpired certificates recorded per node
	// name (default auth.DefaultMaxLiveCerts); one more revokes the oldest.
	MaxLiveNodeCerts int
	// RevocationPurgeInterval is how often expired revocation records are
	// deleted (default 1h).
	RevocationPurgeInterval time.Duration
}

// DefaultApplianceClientCertValidity is the appliance client certificate's
// lifetime.
const DefaultApplianceClientCertValidity = 30 * 24 * time.Hour

func (c *PKIConfig) fill() error {
	for name, d := range map[string]time.Duration{
		"--node-cert-validity": c.NodeCertValidity, "--appliance-client-cert-validity": c.ApplianceClientCertValidity,
		"--revocation-purge-interval": c.RevocationPurgeInterval,
	} {
		if d < 0 {
			return fmt.Errorf("%s %s: must not be negative", name, d)
		}
	}
	if c.MaxLiveNodeCerts < 0 {
		return fmt.Errorf("--max-live-node-certs %d: must not be negative", c.MaxLiveNodeCerts)
	}
	if c.NodeCertValidity == 0 {
		c.NodeCertValidity = pki.NodeValidity
	}
	if c.ApplianceClientCertValidity == 0 {
		c.ApplianceClientCertValidity = DefaultApplianceClientCertValidity
	}
	if c.MaxLiveNodeCerts == 0 {
		c.MaxLiveNodeCerts = auth.DefaultMaxLiveCerts
	}
	if c.RevocationPurgeInterval == 0 {
		c.RevocationPurgeInterval = time.Hour
	}
	return nil
}

// initPKI serves the token service and purges the revocation list; New
// calls it once the tokens, the revocation list and the gRPC server exist.
func (s *Server) initPKI() {
	auth.RegisterTokenService(s.grpc, &auth.TokenService{
		Tokens: s.tokens, Logger: s.log.With("component", "tokens"),
		CheckNode: func(name string) error {
			if err := inventory.CheckName(name); err != nil {
				return err
			}
			return pki.CheckNodeName(name)
		},
	})
	s.addSingleton("revocation-purge", s.purgeRevocations)
}

// purgeRevocations deletes revocation records of expired certificates
// until ctx ends.
func (s *Server) purgeRevocations(ctx context.Context) error {
	return s.purgeEvery(ctx, s.cfg.PKI.RevocationPurgeInterval, "expired certificate records", s.revocations.Purge)
}

// Revocations returns the node certificate records and revocation list.
func (s *Server) Revocations() *auth.Revocations { return s.revocations }
