package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// NodeValidity is how long a node certificate lasts unless the caller asks
// for less (SignNodeCSR's validity). A node renews its certificate through
// Join, presenting the current one, at two thirds of its lifetime.
const NodeValidity = 90 * 24 * time.Hour

// MaxCSRBytes bounds a PEM certificate request: a P-256 or RSA-4096 request
// is well under 4 KiB; anything larger is refused before parsing.
const MaxCSRBytes = 8 << 10

// pemCSR is the PEM block type of a PKCS#10 request.
const pemCSR = "CERTIFICATE REQUEST"

// Sentinel errors of node certificates; test them with errors.Is.
var (
	// ErrBadCSR: the request is oversized, not PEM, unparsable, badly
	// signed or carries an unsupported key.
	ErrBadCSR = errors.New("pki: bad certificate request")
	// ErrBadNodeName: the node name is empty, too long or an IP address.
	ErrBadNodeName = errors.New("pki: bad node name")
)

// CheckNodeName returns an error wrapping ErrBadNodeName if name cannot be
// a node certificate's name: empty, longer than 253 bytes, containing
// anything but letters, digits, '.', '-' and '_', or parsing as an IP
// address in any form a resolver accepts (dotted decimal, "127.1", hex or
// octal labels, IPv6). A node name becomes the certificate's DNS SAN, and a
// name that is an address would let a node pass as a server for that
// address.
func CheckNodeName(name string) error {
	if name == "" || strings.TrimSpace(name) != name {
		return fmt.Errorf("%w: %q is empty or has surrounding space", ErrBadNodeName, name)
	}
	if len(name) > 253 {
		return fmt.Errorf("%w: %d bytes, the limit is 253", ErrBadNodeName, len(name))
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%w: %q contains %q", ErrBadNodeName, name, c)
		}
	}
	if looksLikeIP(name) {
		return fmt.Errorf("%w: %q parses as an IP address; name nodes by host name", ErrBadNodeName, name)
	}
	return nil
}

// looksLikeIP reports whether name is an IP literal or a form inet_aton
// would read as one: its last dot-separated label is all digits or a 0x
// hex number (no top-level domain is numeric, RFC 3696 §2).
func looksLikeIP(name string) bool {
	h := strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if net.ParseIP(h) != nil {
		return true
	}
	labels := strings.Split(strings.TrimSuffix(h, "."), ".")
	last := strings.ToLower(labels[len(labels)-1])
	if last == "" {
		return false
	}
	if hex, ok := strings.CutPrefix(last, "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

// ParseCSR decodes one PEM CERTIFICATE REQUEST of at most MaxCSRBytes and
// checks its self-signature. Errors wrap ErrBadCSR and say what is wrong;
// they are safe to return to the caller.
func ParseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	if len(csrPEM) > MaxCSRBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrBadCSR, len(csrPEM), MaxCSRBytes)
	}
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != pemCSR {
		return nil, fmt.Errorf("%w: no PEM %s block", ErrBadCSR, pemCSR)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: bad signature: %v", ErrBadCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s; use P-256 or P-384", ErrBadCSR, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("%w: RSA key of %d bits; use at least 2048", ErrBadCSR, k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("%w: unsupported key type %T", ErrBadCSR, csr.PublicKey)
	}
	return csr, nil
}

// nodeTemplate is every node certificate: CN and the only DNS SAN = name,
// O = organization, server and client auth (a node serves the appliance
// and calls it), no IP or URI SANs.
func nodeTemplate(name, organization string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{organization}},
		DNSNames:    []string{name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
}

// SignNodeCSR issues the certificate of node name for the PKCS#10 request
// csrPEM. The CA, not the request, decides everything but the key: the
// subject (CN = name, O = organization), the SANs (the one DNS SAN name;
// the request's DNS, IP, URI and e-mail SANs are ignored), the usages
// (server and client auth) and the validity (validity, or NodeValidity
// when 0, never beyond the CA's expiry). It returns the certificate in PEM
// and parsed (for its serial and expiry).
//
// It returns an error wrapping ErrBadNodeName for a name CheckNodeName
// refuses, ErrBadCSR for a request ParseCSR refuses, or a signing error
// (the CA has expired).
func (ca *CA) SignNodeCSR(csrPEM []byte, name, organization string, validity time.Duration) ([]byte, *x509.Certificate, error) {
	if err := CheckNodeName(name); err != nil {
		return nil, nil, err
	}
	if validity < 0 {
		return nil, nil, fmt.Errorf("pki: sign node request: validity %v is negative", validity)
	}
	if validity == 0 {
		validity = NodeValidity
	}
	csr, err := ParseCSR(csrPEM)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, nil, fmt.Errorf("pki: CA expired at %s", ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := nodeTemplate(name, organization)
	tmpl.SerialNumber = serial
	// Backdate for clock skew, but by no more than a quarter of the
	// lifetime: nodes renew at two thirds of NotAfter-NotBefore.
	tmpl.NotBefore = now.Add(-min(backdate, validity/4))
	if tmpl.NotBefore.Before(ca.cert.NotBefore) {
		tmpl.NotBefore = ca.cert.NotBefore
	}
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.signer)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: sign node request: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: parse signed node certificate: %w", err)
	}
	return encodeCertPEM(der), cert, nil
}

// IssueNodeCert issues a node certificate with a fresh ECDSA P-256 key,
// the same certificate SignNodeCSR issues, for callers that must make the
// key themselves (tests of a foreign CA). It returns the certificate and
// its PKCS#8 key in PEM; nothing is written to disk. It returns an error
// for a name CheckNodeName refuses, if the CA has expired or signing fails.
func (ca *CA) IssueNodeCert(name, organization string) (certPEM, keyPEM []byte, err error) {
	if err := CheckNodeName(name); err != nil {
		return nil, nil, fmt.Errorf("pki: issue node certificate: %w", err)
	}
	certPEM, keyPEM, err = ca.issue(nodeTemplate(name, organization), NodeValidity)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: issue node certificate for %q: %w", name, err)
	}
	return certPEM, keyPEM, nil
}

// Serial returns the lowercase hex form of a certificate serial number,
// the key of revocation records.
func Serial(cert *x509.Certificate) string {
	return cert.SerialNumber.Text(16)
}
