package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// File names used inside the directories passed to EnsureCA and
// EnsureServerCert.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
)

const (
	// CACommonName is the subject common name of a generated CA.
	CACommonName = "Corral CA"

	caValidity = 10 * 365 * 24 * time.Hour
	// backdate tolerates modest clock skew between the issuer and verifiers.
	backdate = time.Hour
)

// CA is a loaded certificate authority: its certificate and signing key.
// A CA is immutable once returned and safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	signer  crypto.Signer
}

// EnsureCA returns the CA stored in dir as ca.crt and ca.key, creating dir
// (mode 0700) and a new self-signed ECDSA P-256 CA (CommonName "Corral CA",
// ten-year validity, random serial; ca.crt mode 0644, ca.key mode 0600) if
// neither file exists.
//
// EnsureCA never regenerates an existing CA. It returns an error naming
// the offending file if exactly one of the two files exists, if either
// cannot be read or parsed, if ca.crt is not a CA certificate or has
// expired, or if ca.key does not match ca.crt. It is meant for a single
// owner of dir: concurrent first calls from separate processes may race.
func EnsureCA(dir string) (*CA, error) {
	return ensureCA(dir, CACommonName, newECKey)
}

// ensureCA is EnsureCA for a CA named cn whose keys newKey makes.
func ensureCA(dir, cn string, newKey func() (crypto.Signer, error)) (*CA, error) {
	certPath := filepath.Join(dir, CACertFile)
	keyPath := filepath.Join(dir, CAKeyFile)

	certPEM, err := readOptional(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readOptional(keyPath)
	if err != nil {
		return nil, err
	}
	switch {
	case certPEM == nil && keyPEM == nil:
		return createCA(dir, certPath, keyPath, cn, newKey)
	case keyPEM == nil:
		return nil, fmt.Errorf("pki: %s exists but %s is missing; refusing to create a new CA (restore the key, or remove both files to start over)", certPath, keyPath)
	case certPEM == nil:
		return nil, fmt.Errorf("pki: %s exists but %s is missing; refusing to create a new CA (restore the certificate, or remove both files to start over)", keyPath, certPath)
	}

	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: parse %s: %w", certPath, err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certPath)
	}
	if now := time.Now(); now.After(cert.NotAfter) {
		return nil, fmt.Errorf("pki: %s expired at %s", certPath, cert.NotAfter.UTC().Format(time.RFC3339))
	}
	signer, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: parse %s: %w", keyPath, err)
	}
	if !keyMatches(signer, cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s does not match the public key in %s", keyPath, certPath)
	}
	return &CA{cert: cert, certPEM: certPEM, signer: signer}, nil
}

func createCA(dir, certPath, keyPath, cn string, newKey func() (crypto.Signer, error)) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: create %s: %w", dir, err)
	}
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse new CA certificate: %w", err)
	}
	keyPEM, err := encodeKeyPEM(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode CA key: %w", err)
	}
	certPEM := encodeCertPEM(der)
	// Key first: a crash between the two writes leaves a lone ca.key,
	// which the next EnsureCA reports instead of overwriting.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, signer: key}, nil
}

// newECKey makes the P-256 keys of the appliance's CA and everything it
// issues.
func newECKey() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// CertPEM returns a copy of the CA certificate in PEM form, suitable for
// distributing to clients as their trust anchor.
func (ca *CA) CertPEM() []byte {
	return append([]byte(nil), ca.certPEM...)
}

// Pool returns a new certificate pool containing only this CA. Each call
// returns a fresh pool, so callers may add to it freely.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Fingerprint returns the lowercase hex SHA-256 digest of the DER encoding
// of the first certificate in certPEM. It returns an error if certPEM does
// not start with a PEM CERTIFICATE block or the certificate does not parse.
func Fingerprint(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", errors.New("pki: fingerprint: no PEM data found")
	}
	if block.Type != pemCertificate {
		return "", fmt.Errorf("pki: fingerprint: PEM block is %q, want %q", block.Type, pemCertificate)
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return "", fmt.Errorf("pki: fingerprint: %w", err)
	}
	sum := sha256.Sum256(block.Bytes)
	return hex.EncodeToString(sum[:]), nil
}

// randomSerial returns a positive random 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: generate serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}
