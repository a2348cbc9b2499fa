package pki

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
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
// ca; dir is created (mode 0700) if needed. Each host that parses as an IP
// address becomes an IP SAN; every other host becomes a DNS SAN. The
// certificate also carries the URI SAN clientconfig.ApplianceURI, the appliance
// identity every client checks (clientconfig.VerifyAppliance) and the only URI
// SAN this CA ever writes. It is valid for two years (never beyond the
// CA's own expiry) and carries the server-auth and client-auth extended
// key usages.
//
// An existing pair is reused only if it parses, the key matches, it was
// signed by ca, it has the server-auth usage and the appliance identity,
// it covers every requested host and it does not expire within 30 days (a
// server.crt from before the appliance identity existed is reissued).
// Otherwise a new key and certificate are issued and written atomically
// (temporary file plus rename), key first. The server certificate is disposable, so a
// half-present or unparsable pair is replaced rather than reported.
//
// It returns an error if hosts contains no non-empty entry, if an existing
// file cannot be read for a reason other than not existing, or if issuing
// or writing fails.
func (ca *CA) EnsureServerCert(dir string, hosts []string) (tls.Certificate, error) {
	return ca.ensureServerCert(dir, hosts, true)
}

// ensureServerCert is EnsureServerCert; appliance says whether the
// certificate carries the appliance identity and the client-auth usage
// (the boot CA's HTTPS certificate carries neither).
func (ca *CA) ensureServerCert(dir string, hosts []string, appliance bool) (tls.Certificate, error) {
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
		if err == nil && ca.serverCertFits(tc.Leaf, ips, names, appliance, time.Now()) {
			return tc, nil
		}
	}

	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: serverCommonName},
		DNSNames:    names,
		IPAddresses: ips,
		URIs:        []*url.URL{applianceURI()},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if !appliance {
		tmpl.URIs = nil
		// RSA key exchange encrypts the premaster secret to the key.
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
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
func (ca *CA) serverCertFits(leaf *x509.Certificate, ips []net.IP, names []string, appliance bool, now time.Time) bool {
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
	if appliance && clientconfig.VerifyAppliance(leaf) != nil {
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
// for a new key of the CA's kind (P-256; RSA for the boot CA) and returns
// the PEM certificate and key.
func (ca *CA) issue(tmpl *x509.Certificate, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	now := time.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, nil, fmt.Errorf("CA expired at %s", ca.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	newKey := newECKey
	if _, ok := ca.signer.Public().(*rsa.PublicKey); ok {
		newKey = newRSAKey
	}
	key, err := newKey()
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

// applianceURI is clientconfig.ApplianceURI as a URL.
func applianceURI() *url.URL {
	u, err := url.Parse(clientconfig.ApplianceURI)
	if err != nil {
		panic("pki: clientconfig.ApplianceURI does not parse: " + err.Error()) // a constant
	}
	return u
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
