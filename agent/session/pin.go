package session

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/corralhq/corral/api/clientconfig"
)

// ErrFingerprint means the appliance presented no certificate, and none of the
// extra CA candidates chains its certificate, whose SHA-256 matches the
// pinned fingerprint.
var ErrFingerprint = errors.New("appliance certificate does not match the pinned CA fingerprint")

// Fingerprint returns the lowercase hex SHA-256 of a certificate's DER.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// PinnedTLS returns a client TLS configuration that accepts the server
// only if its chain verifies up to a CA certificate whose SHA-256 is
// fingerprint and its certificate is the appliance's
// (clientconfig.VerifyAppliance: a node certificate from the same CA is
// refused). The CA is looked for in the chain the server sends (so the
// server must send its CA after the leaf) and in extraCAs (for example a
// PEM shipped in a second initrd); the leaf must be valid for the name
// dialled. The full CA PEM does not fit on the kernel command line, hence
// the pin. The standard verification is replaced, not added to:
// InsecureSkipVerify is set and VerifyConnection does the work.
func PinnedTLS(fingerprint string, extraCAs []*x509.Certificate) *tls.Config {
	fingerprint = strings.ToLower(fingerprint)
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs, fingerprint, extraCAs)
		},
	}
}

func verifyPinned(cs tls.ConnectionState, fingerprint string, extraCAs []*x509.Certificate) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: the server sent no certificate", ErrFingerprint)
	}
	leaf := cs.PeerCertificates[0]
	roots := x509.NewCertPool()
	inter := x509.NewCertPool()
	found := false
	var seen []string
	for i, c := range append(append([]*x509.Certificate{}, cs.PeerCertificates...), extraCAs...) {
		fp := Fingerprint(c)
		if i < len(cs.PeerCertificates) {
			seen = append(seen, fmt.Sprintf("%q sha256=%s", c.Subject.CommonName, fp[:16]))
		}
		if fp == fingerprint {
			roots.AddCert(c)
			found = true
		} else if i > 0 && i < len(cs.PeerCertificates) {
			inter.AddCert(c)
		}
	}
	if !found {
		return fmt.Errorf("%w %s…: server sent %s; is corral.ca from this appliance, and does it send its CA in the chain?",
			ErrFingerprint, fingerprint[:min(16, len(fingerprint))], strings.Join(seen, ", "))
	}
	if Fingerprint(leaf) == fingerprint {
		return nil // the pinned certificate itself
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		DNSName:       cs.ServerName,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("appliance certificate does not verify against the pinned CA: %w", err)
	}
	// The pinned CA also signs node certificates: only the appliance's
	// own carries its identity.
	return clientconfig.VerifyAppliance(leaf)
}
