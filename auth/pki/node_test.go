package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/google/go-cmp/cmp"
)

// csrFor returns a PEM request signed by key for tmpl.
func csrFor(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der})
}

func p256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestSignNodeCSRIgnoresRequest: whatever the request asks for (another
// CN, an Organization, IP, URI, e-mail and DNS SANs, one of them the
// appliance identity), the certificate carries only what the CA decides.
func TestSignNodeCSRIgnoresRequest(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	appliance, _ := url.Parse(clientconfig.ApplianceURI)
	key := p256(t)
	csr := csrFor(t, key, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "evil", Organization: []string{"admins"}},
		DNSNames:       []string{"localhost", "corrald", "node-2"},
		IPAddresses:    []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.0.0.11")},
		URIs:           []*url.URL{appliance},
		EmailAddresses: []string{"root@example.test"},
	})
	certPEM, cert, err := ca.SignNodeCSR(csr, "node-1", nodeid.Organization, 0)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := parseCertPEM(certPEM)
	if err != nil || !parsed.Equal(cert) {
		t.Fatalf("PEM and parsed certificate differ: %v", err)
	}
	type view struct {
		CN, Serial  string
		O, DNS, IPs []string
		URIs, Email []string
		EKU         []x509.ExtKeyUsage
		KeyMatches  bool
	}
	got := view{CN: cert.Subject.CommonName, O: cert.Subject.Organization, DNS: cert.DNSNames,
		EKU: cert.ExtKeyUsage, Email: cert.EmailAddresses, KeyMatches: key.PublicKey.Equal(cert.PublicKey)}
	for _, ip := range cert.IPAddresses {
		got.IPs = append(got.IPs, ip.String())
	}
	for _, u := range cert.URIs {
		got.URIs = append(got.URIs, u.String())
	}
	want := view{CN: "node-1", O: []string{nodeid.Organization}, DNS: []string{"node-1"},
		EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyMatches: true}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("node certificate (-want +got):\n%s", d)
	}
	if Serial(cert) != cert.SerialNumber.Text(16) || Serial(cert) == "" {
		t.Errorf("Serial = %q", Serial(cert))
	}
	if d := time.Until(cert.NotAfter); d < NodeValidity-time.Hour || d > NodeValidity {
		t.Errorf("validity %v, want %v", d, NodeValidity)
	}
	// It is not the appliance, and verifies as a server for its name only.
	if err := clientconfig.VerifyAppliance(cert); !errors.Is(err, clientconfig.ErrNotAppliance) {
		t.Errorf("VerifyAppliance(node certificate) = %v, want ErrNotAppliance", err)
	}
	for name, wantOK := range map[string]bool{"node-1": true, "127.0.0.1": false, "localhost": false, "node-2": false} {
		_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if (err == nil) != wantOK {
			t.Errorf("verify as server %s: %v, want ok=%v", name, err, wantOK)
		}
	}
}

func TestSignNodeCSRValidity(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	csr := csrFor(t, p256(t), &x509.CertificateRequest{})
	_, cert, err := ca.SignNodeCSR(csr, "n1", nodeid.Organization, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(cert.NotAfter); d > time.Minute || d < 50*time.Second {
		t.Errorf("validity %v, want 1m", d)
	}
	long, cert, err := ca.SignNodeCSR(csr, "n1", nodeid.Organization, 50*365*24*time.Hour)
	if err != nil || long == nil {
		t.Fatal(err)
	}
	if cert.NotAfter.After(ca.cert.NotAfter) {
		t.Errorf("node certificate outlives the CA: %v > %v", cert.NotAfter, ca.cert.NotAfter)
	}
	if _, _, err := ca.SignNodeCSR(csr, "n1", nodeid.Organization, -time.Second); err == nil {
		t.Error("negative validity accepted")
	}
}

func TestSignNodeCSRRefuses(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	good := csrFor(t, p256(t), &x509.CertificateRequest{})
	der, _ := pem.Decode(good)
	tampered := slices.Clone(der.Bytes)
	tampered[len(tampered)-5] ^= 0xff
	rsaSmall, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	for name, tc := range map[string]struct {
		csr  []byte
		node string
		want error
	}{
		"garbage":            {[]byte("garbage"), "n1", ErrBadCSR},
		"certificate PEM":    {ca.CertPEM(), "n1", ErrBadCSR},
		"bad signature":      {pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: tampered}), "n1", ErrBadCSR},
		"oversized":          {append(slices.Clone(good), make([]byte, MaxCSRBytes)...), "n1", ErrBadCSR},
		"RSA 1024":           {csrFor(t, rsaSmall, &x509.CertificateRequest{}), "n1", ErrBadCSR},
		"P-224":              {csrFor(t, p224, &x509.CertificateRequest{}), "n1", ErrBadCSR},
		"empty name":         {good, "", ErrBadNodeName},
		"IPv4 name":          {good, "10.0.0.1", ErrBadNodeName},
		"IPv6 name":          {good, "::1", ErrBadNodeName},
		"short IPv4 name":    {good, "127.1", ErrBadNodeName},
		"hex IPv4 name":      {good, "0x7f000001", ErrBadNodeName},
		"trailing dot IP":    {good, "10.0.0.1.", ErrBadNodeName},
		"name with a slash":  {good, "a/b", ErrBadNodeName},
		"name with a colon":  {good, "urn:corral:appliance", ErrBadNodeName},
		"name with a space":  {good, " n1", ErrBadNodeName},
		"name over 253 byte": {good, strings.Repeat("a", 254), ErrBadNodeName},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := ca.SignNodeCSR(tc.csr, tc.node, nodeid.Organization, 0)
			if !errors.Is(err, tc.want) {
				t.Fatalf("SignNodeCSR = %v, want %v", err, tc.want)
			}
		})
	}
	// Keys the CA accepts.
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"ed25519": edKey, "RSA 2048": rsaKey} {
		if _, _, err := ca.SignNodeCSR(csrFor(t, key, &x509.CertificateRequest{}), "n1", nodeid.Organization, 0); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckNodeName(t *testing.T) {
	for name, ok := range map[string]bool{
		"node-1": true, "m-525400123456": true, "rack1.node_2": true, "n10": true, "a.b.c10x": true,
		"1node": true, "0xnode": true, "10.0.0.1": false, "127.1": false, "0x7f.1": false, "[::1]": false,
		"fe80::1": false, "1234": false, "": false,
	} {
		if err := CheckNodeName(name); (err == nil) != ok {
			t.Errorf("CheckNodeName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestIssueNodeCert(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	certPEM, keyPEM, err := ca.IssueNodeCert("m-1", nodeid.Organization)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf := tc.Leaf
	if leaf.Subject.CommonName != "m-1" || !slices.Equal(leaf.Subject.Organization, []string{nodeid.Organization}) ||
		!slices.Equal(leaf.DNSNames, []string{"m-1"}) || len(leaf.IPAddresses) != 0 || len(leaf.URIs) != 0 {
		t.Fatalf("subject %v SANs %v %v %v", leaf.Subject, leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
	}
	other := mustCA(t, t.TempDir())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("node certificate verifies against another CA")
	}
	for _, bad := range []string{" ", "10.1.2.3"} {
		if _, _, err := ca.IssueNodeCert(bad, nodeid.Organization); !errors.Is(err, ErrBadNodeName) {
			t.Errorf("IssueNodeCert(%q) = %v, want ErrBadNodeName", bad, err)
		}
	}
}

// TestServerCertApplianceIdentity: the server certificate carries the
// appliance identity, and one written before it existed (same hosts,
// same CA, far from expiry) is reissued.
func TestServerCertApplianceIdentity(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir)
	hosts := []string{"localhost", "127.0.0.1"}
	// An old-style certificate: right hosts and usages, no URI SAN.
	ips, names, _ := splitHosts(hosts)
	certPEM, keyPEM, err := ca.issue(&x509.Certificate{
		Subject: pkix.Name{CommonName: serverCommonName}, DNSNames: names, IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, serverValidity)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ServerCertFile), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ServerKeyFile), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientconfig.VerifyAppliance(old.Leaf); err == nil {
		t.Fatal("a certificate without the URI SAN passes as the appliance")
	}
	got, err := ca.EnsureServerCert(dir, hosts)
	if err != nil {
		t.Fatal(err)
	}
	if got.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 {
		t.Fatal("server certificate without the appliance identity was kept")
	}
	if err := clientconfig.VerifyAppliance(got.Leaf); err != nil {
		t.Errorf("reissued server certificate: %v", err)
	}
	if uris := got.Leaf.URIs; len(uris) != 1 || uris[0].String() != clientconfig.ApplianceURI {
		t.Errorf("URIs = %v, want [%s]", uris, clientconfig.ApplianceURI)
	}
	again, err := ca.EnsureServerCert(dir, hosts)
	if err != nil {
		t.Fatal(err)
	}
	if again.Leaf.SerialNumber.Cmp(got.Leaf.SerialNumber) != 0 {
		t.Error("a fitting server certificate was reissued")
	}
	// The client certificate (the appliance dialling nodes) is not the
	// appliance as a server either.
	cp, _, err := ca.IssueClientCert("corral-appliance", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := parseCertPEM(cp)
	if err := clientconfig.VerifyAppliance(cc); err == nil {
		t.Error("client certificate passes as the appliance")
	}
}
