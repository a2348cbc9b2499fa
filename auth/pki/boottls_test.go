package pki

import (
	"bytes"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/api/clientconfig"
)

func TestBootCAIsRSAAndKept(t *testing.T) {
	dir := t.TempDir()
	ca, err := EnsureBootCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ca.cert.PublicKey.(*rsa.PublicKey); !ok || ca.cert.Subject.CommonName != BootCACommonName {
		t.Fatalf("boot CA %T %q, want RSA %q", ca.cert.PublicKey, ca.cert.Subject.CommonName, BootCACommonName)
	}
	again, err := EnsureBootCA(dir)
	if err != nil || !bytes.Equal(again.CertDER(), ca.CertDER()) {
		t.Fatalf("second EnsureBootCA: err %v, same CA %v", err, err == nil && bytes.Equal(again.CertDER(), ca.CertDER()))
	}
	// An ECDSA CA where the boot CA should be is refused, not replaced.
	ec := t.TempDir()
	if _, err := EnsureCA(ec); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureBootCA(ec); err == nil || !strings.Contains(err.Error(), "must be RSA") {
		t.Fatalf("EnsureBootCA over an ECDSA CA: %v", err)
	}
}

// TestBootServerHandshakeRSAKeyExchange: a client that offers only RSA key
// exchange and TLS 1.2, as EDK2's HTTPS boot does, completes the handshake
// and verifies the chain against the boot CA for the IP; the certificate
// is not an appliance certificate, and a client trusting the appliance CA
// refuses it.
func TestBootServerHandshakeRSAKeyExchange(t *testing.T) {
	dir := t.TempDir()
	ca, err := EnsureBootCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.EnsureBootServerCert(filepath.Join(dir, "srv"), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if clientconfig.VerifyAppliance(cert.Leaf) == nil {
		t.Fatal("the boot server certificate passes as the appliance")
	}
	if cert.Leaf.KeyUsage&x509.KeyUsageKeyEncipherment == 0 {
		t.Fatal("no key encipherment: RSA key exchange clients refuse it")
	}
	again, err := ca.EnsureBootServerCert(filepath.Join(dir, "srv"), []string{"127.0.0.1"})
	if err != nil || !bytes.Equal(again.Leaf.Raw, cert.Leaf.Raw) {
		t.Fatalf("a fitting boot server certificate was reissued (err %v)", err)
	}

	lis, err := tls.Listen("tcp", "127.0.0.1:0", BootTLSConfig(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	dial := func(roots *x509.CertPool) (tls.ConnectionState, error) {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{
			RootCAs: roots, ServerName: "127.0.0.1", MaxVersion: tls.VersionTLS12,
			CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA256, tls.TLS_RSA_WITH_AES_256_CBC_SHA},
		})
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer c.Close()
		return c.ConnectionState(), nil
	}
	st, err := dial(pool)
	if err != nil {
		t.Fatalf("RSA key exchange client: %v", err)
	}
	if st.CipherSuite != tls.TLS_RSA_WITH_AES_128_CBC_SHA256 && st.CipherSuite != tls.TLS_RSA_WITH_AES_256_CBC_SHA {
		t.Fatalf("suite %s", tls.CipherSuiteName(st.CipherSuite))
	}
	app, err := EnsureCA(filepath.Join(dir, "app"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dial(app.Pool()); err == nil {
		t.Fatal("a client trusting the appliance CA accepted the boot certificate")
	}
}

func TestEFISignatureList(t *testing.T) {
	der := []byte("0123456789 not really DER")
	esl := EFISignatureList(der)
	le := binary.LittleEndian
	if !bytes.Equal(esl[:16], efiCertX509[:]) {
		t.Fatalf("signature type % x", esl[:16])
	}
	if got := le.Uint32(esl[16:]); int(got) != len(esl) {
		t.Fatalf("list size %d, len %d", got, len(esl))
	}
	if le.Uint32(esl[20:]) != 0 || int(le.Uint32(esl[24:])) != 16+len(der) {
		t.Fatalf("header size %d, signature size %d", le.Uint32(esl[20:]), le.Uint32(esl[24:]))
	}
	if !bytes.Equal(esl[28+16:], der) {
		t.Fatal("certificate not at the end of the entry")
	}
}
