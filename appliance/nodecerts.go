package appliance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
)

// signNodeCert signs csrPEM as the certificate of node name and records its
// serial under the name (so reprovisioning or deleting the machine revokes
// it); via says how it was asked for ("install": the discovery agent's
// CertificateRequest during an install; "join": AgentService.Join with a
// token; "renew": Join with the node's own certificate). The appliance
// decides subject, SANs (DNS SAN = name only), usages and validity
// (PKIConfig.NodeCertValidity). It returns the certificate PEM, or an
// apierr-classed error: Invalid for a bad name or request.
func (s *Server) signNodeCert(ctx context.Context, name string, csrPEM []byte, via string) ([]byte, error) {
	return s.issueNodeCert(ctx, name, csrPEM, via, nil)
}

// issueNodeCert is signNodeCert with a commit step: when commit is set it
// runs after signing and before recording, and its error withholds the
// certificate (Join consumes its single-use token there, so of two Joins
// racing with one token only one gets a certificate).
func (s *Server) issueNodeCert(ctx context.Context, name string, csrPEM []byte, via string, commit func(context.Context) error) ([]byte, error) {
	certPEM, cert, err := s.ca.SignNodeCSR(csrPEM, name, auth.NodeOrganization, s.cfg.PKI.NodeCertValidity)
	switch {
	case errors.Is(err, pki.ErrBadCSR), errors.Is(err, pki.ErrBadNodeName):
		return nil, apierr.Invalidf("%v", err)
	case err != nil:
		return nil, fmt.Errorf("sign node certificate for %q: %w", name, err)
	}
	if commit != nil {
		if err := commit(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.revocations.Record(ctx, name, cert, via); err != nil {
		s.log.Error("node certificate withheld: its serial could not be recorded", "node", name, "via", via, "err", err)
		return nil, err
	}
	s.log.Info("node certificate issued", "node", name, "via", via, "serial", pki.Serial(cert),
		"not_after", cert.NotAfter.UTC().Format(time.RFC3339))
	return certPEM, nil
}

// revokeNodeCerts revokes every certificate issued for node name (machine
// reprovisioned or deleted) and logs the serials.
func (s *Server) revokeNodeCerts(ctx context.Context, name, reason string) error {
	serials, err := s.revocations.RevokeName(ctx, name, reason)
	if len(serials) > 0 {
		s.log.Info("node certificates revoked", "node", name, "reason", reason, "serials", serials)
	}
	if err != nil {
		return fmt.Errorf("revoke the certificates of node %q: %w", name, err)
	}
	return nil
}

// certRevoker is the lifecycle's CertRevoker: the appliance's revocation
// list.
type certRevoker struct{ s *Server }

func (r certRevoker) RevokeNode(ctx context.Context, name, reason string) error {
	return r.s.revokeNodeCerts(ctx, name, reason)
}
