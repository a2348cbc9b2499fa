package clientconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
)

// ApplianceURI is the URI SAN that marks the appliance's own server
// certificate. The appliance CA writes URI SANs into that certificate only:
// node certificates (signed from a node's CSR) never carry one, because the
// CA never copies anything but the public key from a request. Every client
// of corrald checks it with VerifyAppliance, so a node certificate, which
// chains to the same CA, is never accepted as the appliance.
const ApplianceURI = "urn:corral:appliance"

// NodeOrganization is the Subject.Organization entry of every node
// certificate the appliance issues. The appliance makes a verified
// certificate carrying it a node principal; a node refuses callers
// presenting one; a client refuses a server presenting one.
const NodeOrganization = "corral:node"

// ErrNotAppliance means the server's certificate chains to the appliance CA but
// is not the appliance's (it lacks ApplianceURI, or it is a node
// certificate).
var ErrNotAppliance = errors.New("server certificate is not the appliance's")

// VerifyAppliance returns nil if leaf, a server certificate that already
// verified against the appliance CA, is the appliance's: it carries the
// ApplianceURI URI SAN and is not a node certificate (NodeOrganization).
// It returns an error wrapping ErrNotAppliance naming the certificate
// otherwise. It does not check the chain: call it after verification.
func VerifyAppliance(leaf *x509.Certificate) error {
	if leaf == nil {
		return fmt.Errorf("%w: no certificate", ErrNotAppliance)
	}
	if slices.Contains(leaf.Subject.Organization, NodeOrganization) {
		return fmt.Errorf("%w: %q is a node certificate", ErrNotAppliance, leaf.Subject.CommonName)
	}
	for _, u := range leaf.URIs {
		if u.String() == ApplianceURI {
			return nil
		}
	}
	return fmt.Errorf("%w: %q lacks the %s identity", ErrNotAppliance, leaf.Subject.CommonName, ApplianceURI)
}

// VerifyApplianceConnection is a tls.Config.VerifyConnection for clients
// that verify the server against the appliance CA (RootCAs): it runs after
// the standard verification and applies VerifyAppliance to the verified
// leaf. A connection without a verified chain (InsecureSkipVerify) is
// refused.
func VerifyApplianceConnection(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return fmt.Errorf("%w: the server's certificate was not verified", ErrNotAppliance)
	}
	return VerifyAppliance(cs.VerifiedChains[0][0])
}
