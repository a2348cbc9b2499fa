package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	serverValidity = 2 * 365 * 24 * time.Hour
	// renewBefore is how close to expiry a server certificate may get
	// before EnsureServerCert reissues it.
	renewBefore = 30 * 24 * time.Hour

	serverCommonName = "corrald"
)

// EnsureServerCert returns a TLS server certificate for hosts, stored in
// dir as server.crt (mode 0644) and server.key (mode 0600) and signed by
// ca; dir is created (mode 0700) if needed. Each host that parses as an IP address becomes an IP SAN; every
// other host becomes a DNS SAN. The certificate is valid for two years
// (never beyond the CA's own expiry) and carries the server-auth and
// client-auth extended key usages.
//
// An existing pair is reused only if it parses, the key matches, it was
// signed by ca, it has the server-auth usage, it covers every requested
// host and it does not expire within 30 days. Otherwise a new key and
// certificate are issued and written atomically (temporary file plus
// rename), key first. The server certificate is disposable, so a
// half-present or unparsable pair is replaced rather than reported.
//
// It returns an error if hosts contains no non-empty entry, if an existing
// file cannot be read for a reason other than not existing, or if issuing
// or writing fails.
func (ca *CA) EnsureServerCert(dir string, hosts []string) (tls.Certificate, error) {
	ips, names, err := splitHosts(hosts)
	if err != nil {
		return tls.Certificate{}, err
	}
	certPath := filepath.Join(dir, ServerCertFile)
	keyPath := filepath.Join(dir, ServerKeyFile)

	certPEM, err := readOptional(certPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := readOptional(keyPath)
	if err != nil {
		return tls.Certificate{}, err
	}
	if certPEM != nil && keyPEM != nil {
		tc, err := tls.X509KeyPair(certPEM, keyPEM)
		if err == nil && ca.serverCertFits(tc.Leaf, ips, names, time.Now()) {
			return tc, nil
		}
	}

	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: serverCommonName},
		DNSNames:    names,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	certPEM, keyPEM, err = ca.issue(tmpl, serverValidity)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: issue server certificate: %w", err)
	}
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: load new server certificate: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: create %s: %w", dir, err)
	}
	// Key first: if the cert write fails, the old cert no longer matches
	// the new key and the next call reissues.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return tc, nil
}

// serverCertFits reports whether leaf can keep serving for ips and names.
func (ca *CA) serverCertFits(leaf *x509.Certificate, ips []net.IP, names []string, now time.Time) bool {
	if leaf == nil {
		return false
	}
	if leaf.CheckSignatureFrom(ca.cert) != nil {
		return false
	}
	if now.Add(renewBefore).After(leaf.NotAfter) {
		return false
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		return false
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return false
		}
	}
	for _, name := range names {
		if !slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return strings.EqualFold(n, name) }) {
			return false
		}
	}
	return true
}

// IssueClientCert issues a client certificate (client-auth extended key
// usage) for commonName with a fresh ECDSA P-256 key, valid from now for
// validity but never beyond the CA's own expiry. It returns the certificate
// and its PKCS#8 private key in PEM form. Nothing is written to disk.
//
// It returns an error if commonName is empty, validity is not positive,
// the CA has expired, or signing fails.
func (ca *CA) IssueClientCert(commonName string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if strings.TrimSpace(commonName) == "" {
		return nil, nil, errors.New("pki: issue client certificate: empty common name")
	}
	if validity <= 0 {
		return nil, nil, fmt.Errorf("pki: issue client certificate for %q: validity %v is not positive", commonName, validity)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	certPEM, keyPEM, err = ca.issue(tmpl, validity)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: issue client certificate for %q: %w", commonName, err)
	}
	return certPEM, keyPEM, nil
}

// issue fills in the serial number and validity window of tmpl, signs it
// for a new P-256 key and returns the PEM certificate and key.
func (ca *CA) issue(tmpl *x509.Certificate, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	now := time.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, nil, fmt.Errorf("CA expired at %s", ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-backdate)
	if tmpl.NotBefore.Before(ca.cert.NotBefore) {
		tmpl.NotBefore = ca.cert.NotBefore
	}
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = false
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.signer)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKeyPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return encodeCertPEM(der), keyPEM, nil
}

// splitHosts normalises hosts into deduplicated IP and DNS SANs. Blank
// entries are skipped and brackets around IPv6 literals are removed.
func splitHosts(hosts []string) ([]net.IP, []string, error) {
	var (
		ips   []net.IP
		names []string
		seen  = map[string]bool{}
	)
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			if k := "ip:" + ip.String(); !seen[k] {
				seen[k] = true
				ips = append(ips, ip)
			}
			continue
		}
		name := strings.ToLower(strings.TrimSuffix(h, "."))
		if k := "dns:" + name; name != "" && !seen[k] {
			seen[k] = true
			names = append(names, name)
		}
	}
	if len(ips) == 0 && len(names) == 0 {
		return nil, nil, errors.New("pki: server certificate needs at least one host")
	}
	return ips, names, nil
}

// NodeValidity is how long a node identity issued by SignNodeCSR lasts.
const NodeValidity = 365 * 24 * time.Hour

// SignNodeCSR issues a node identity for the PKCS#10 request csrPEM: the
// CA, not the request, decides the subject (CN = name, O = organization),
// the usages (server and client auth: a node serves the appliance and
// calls it) and the validity; from the request it takes only the public
// key, after checking the request's signature, and its IP address SANs.
// SANs are those IPs, hosts, and the DNS name = name. It returns the
// certificate in PEM.
func (ca *CA) SignNodeCSR(csrPEM []byte, name, organization string, hosts []string) ([]byte, error) {
	if strings.TrimSpace(name) == "" {
		return nil, errors.New("pki: sign node request: empty node name")
	}
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("pki: sign node request: no PEM CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: sign node request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: sign node request: bad signature: %w", err)
	}
	sans := append([]string{name}, hosts...)
	for _, ip := range csr.IPAddresses {
		sans = append(sans, ip.String())
	}
	ips, names, err := splitHosts(sans)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, fmt.Errorf("pki: CA expired at %s", ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{organization}},
		DNSNames:              names,
		IPAddresses:           ips,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(NodeValidity),
		BasicConstraintsValid: true,
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.signer)
	if err != nil {
		return nil, fmt.Errorf("pki: sign node request: %w", err)
	}
	return encodeCertPEM(der), nil
}

// IssueNodeCert issues a node identity with a fresh ECDSA P-256 key, the
// same certificate SignNodeCSR issues (CN = name, O = organization, DNS
// SAN = name, server and client auth, NodeValidity but never beyond the
// CA's expiry), for an install that carries the key to the machine. It
// returns the certificate and its PKCS#8 key in PEM; nothing is written to
// disk. It returns an error if name is empty, the CA has expired or
// signing fails.
func (ca *CA) IssueNodeCert(name, organization string) (certPEM, keyPEM []byte, err error) {
	if strings.TrimSpace(name) == "" {
		return nil, nil, errors.New("pki: issue node certificate: empty node name")
	}
	ips, names, err := splitHosts([]string{name})
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{organization}},
		DNSNames:    names,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	certPEM, keyPEM, err = ca.issue(tmpl, NodeValidity)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: issue node certificate for %q: %w", name, err)
	}
	return certPEM, keyPEM, nil
}
