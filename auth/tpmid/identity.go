package tpmid

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// Identity is the stable identity of an endorsement key: the lower-case
// hex SHA-256 of its public key in PKIX DER (64 digits). It is the same
// whether the agent read the key from the TPM or from its certificate.
func Identity(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("endorsement key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// oidSubjectAltName is the SAN extension. An EK certificate's SAN holds
// the TPM's manufacturer, model and version as a directory name, and is
// critical when the subject is empty; Go's verifier counts a SAN with no
// DNS name, address, e-mail or URI as unhandled and would refuse it.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// ErrNoCertificate means CAs are configured and the TPM offered no EK
// certificate.
var ErrNoCertificate = errors.New("the TPM has no endorsement key certificate, and EK CAs are configured")

// LoadCAs reads PEM files of TPM manufacturer CA certificates (roots and
// intermediates alike) into a pool; nil files give a nil pool.
func LoadCAs(files []string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("EK CA: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("EK CA %s: no PEM certificate in it", f)
		}
	}
	return pool, nil
}

// checkCertificate verifies an EK certificate (DER) against roots at now
// and that it certifies ekDER, the EK's PKIX public key. Manufacturers'
// intermediates are expected in roots too (TPMs store only the leaf).
func checkCertificate(certDER, ekDER []byte, roots *x509.CertPool, now time.Time) error {
	if len(certDER) == 0 {
		return ErrNoCertificate
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return fmt.Errorf("EK certificate: %w", err)
	}
	certPub, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil || !slices.Equal(certPub, ekDER) {
		return errors.New("the EK certificate is for another key than the endorsement key offered")
	}
	cert.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(cert.UnhandledCriticalExtensions), func(o asn1.ObjectIdentifier) bool {
		return o.Equal(oidSubjectAltName)
	})
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("EK certificate: %w", err)
	}
	return nil
}
