package tpmid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

// ekCert makes a CA and an EK certificate shaped as TPM manufacturers
// make them: empty subject, the TPM's manufacturer in a critical SAN
// directory name, the EK certificate's extended key usage.
func ekCert(t *testing.T, ekPub any) (caPool *x509.CertPool, certDER []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Test TPM Manufacturer CA"},
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2046, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	// SAN: directoryName { tcg-at-tpmManufacturer = "id:54455354" }
	dirName, _ := asn1.Marshal([]pkix.AttributeTypeAndValueSET{{Type: asn1.ObjectIdentifier{2, 23, 133, 2, 1},
		Value: [][]pkix.AttributeTypeAndValue{{{Type: asn1.ObjectIdentifier{2, 23, 133, 2, 1}, Value: "id:54455354"}}}}})
	san, _ := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: dirName}})
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2),
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2046, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:           x509.KeyUsageKeyEncipherment,
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{{2, 23, 133, 8, 1}},
		ExtraExtensions:    []pkix.Extension{{Id: oidSubjectAltName, Critical: true, Value: san}}}
	certDER, err = x509.CreateCertificate(rand.Reader, leaf, caCert, ekPub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, certDER
}

func TestCheckCertificate(t *testing.T) {
	ek, _ := rsa.GenerateKey(rand.Reader, 2048)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	pool, cert := ekCert(t, &ek.PublicKey)
	_, strange := ekCert(t, &ek.PublicKey) // signed by another CA
	ekDER, _ := x509.MarshalPKIXPublicKey(&ek.PublicKey)
	otherDER, _ := x509.MarshalPKIXPublicKey(&other.PublicKey)
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	if err := checkCertificate(cert, ekDER, pool, now); err != nil {
		t.Fatalf("a manufacturer's EK certificate refused: %v", err)
	}
	for name, tc := range map[string]struct {
		cert, ek []byte
		at       time.Time
		want     string
	}{
		"no certificate":  {nil, ekDER, now, "no endorsement key certificate"},
		"another key":     {cert, otherDER, now, "another key"},
		"another CA":      {strange, ekDER, now, "unknown authority"},
		"expired":         {cert, ekDER, time.Date(2047, 1, 1, 0, 0, 0, 0, time.UTC), "expired"},
		"not certificate": {[]byte("junk"), ekDER, now, "EK certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			err := checkCertificate(tc.cert, tc.ek, pool, tc.at)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
			if name == "no certificate" && !errors.Is(err, ErrNoCertificate) {
				t.Fatalf("err %v, want ErrNoCertificate", err)
			}
		})
	}
}
