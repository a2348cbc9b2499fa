package server

import (
	"context"

	"github.com/corralhq/corral/auth"
)

// signNodeCert signs csrPEM as the identity of node name; via says how it
// was asked for ("install": the discovery agent's CertificateRequest during
// an install; "join": AgentService.Join). It returns the certificate PEM.
func (s *Server) signNodeCert(ctx context.Context, name string, csrPEM []byte, via string) ([]byte, error) {
	return s.ca.SignNodeCSR(csrPEM, name, auth.NodeOrganization, nil)
}
