package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustCA(t *testing.T, dir string) *CA {
	t.Helper()
	ca, err := EnsureCA(dir)
	if err != nil {
		t.Fatalf("EnsureCA(%s): %v", dir, err)
	}
	return ca
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestEnsureCACreateThenLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca1 := mustCA(t, dir)

	if ca1.cert.Subject.CommonName != CACommonName {
		t.Errorf("CommonName = %q, want %q", ca1.cert.Subject.CommonName, CACommonName)
	}
	if !ca1.cert.IsCA {
		t.Error("generated certificate is not a CA")
	}
	if ca1.cert.SerialNumber.Sign() <= 0 {
		t.Errorf("serial %v is not positive", ca1.cert.SerialNumber)
	}
	if got := time.Until(ca1.cert.NotAfter); got < 9*365*24*time.Hour {
		t.Errorf("CA validity %v, want about ten years", got)
	}

	ca2 := mustCA(t, dir)
	if !bytes.Equal(ca1.CertPEM(), ca2.CertPEM()) {
		t.Error("second EnsureCA returned a different certificate")
	}
	if !keyMatches(ca2.signer, ca1.cert.PublicKey) {
		t.Error("second EnsureCA returned a different key")
	}

	other := mustCA(t, t.TempDir())
	if other.cert.SerialNumber.Cmp(ca1.cert.SerialNumber) == 0 {
		t.Error("two CAs share a serial number")
	}
}

func TestFileModes(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir)
	if _, err := ca.EnsureServerCert(dir, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		CACertFile:     0o644,
		CAKeyFile:      0o600,
		ServerCertFile: 0o644,
		ServerKeyFile:  0o600,
	} {
		if got := fileMode(t, filepath.Join(dir, name)); got != want {
			t.Errorf("%s mode = %o, want %o", name, got, want)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestEnsureCAMismatchedKeyRefused(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	mustCA(t, dirA)
	mustCA(t, dirB)
	keyB, err := os.ReadFile(filepath.Join(dirB, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dirA, CAKeyFile)
	if err := os.WriteFile(keyPath, keyB, 0o600); err != nil {
		t.Fatal(err)
	}
	certBefore, _ := os.ReadFile(filepath.Join(dirA, CACertFile))

	_, err = EnsureCA(dirA)
	if err == nil {
		t.Fatal("EnsureCA accepted a key that does not match the certificate")
	}
	if !strings.Contains(err.Error(), keyPath) {
		t.Errorf("error %q does not name %s", err, keyPath)
	}
	certAfter, _ := os.ReadFile(filepath.Join(dirA, CACertFile))
	keyAfter, _ := os.ReadFile(keyPath)
	if !bytes.Equal(certBefore, certAfter) || !bytes.Equal(keyB, keyAfter) {
		t.Error("EnsureCA modified files after refusing")
	}
}

func TestEnsureCAHalfPresentRefused(t *testing.T) {
	for _, missing := range []string{CACertFile, CAKeyFile} {
		t.Run("missing "+missing, func(t *testing.T) {
			dir := t.TempDir()
			mustCA(t, dir)
			if err := os.Remove(filepath.Join(dir, missing)); err != nil {
				t.Fatal(err)
			}
			_, err := EnsureCA(dir)
			if err == nil {
				t.Fatal("EnsureCA proceeded with half a CA")
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, missing)) {
				t.Errorf("error %q does not name the missing file", err)
			}
			if _, err := os.Stat(filepath.Join(dir, missing)); !os.IsNotExist(err) {
				t.Errorf("EnsureCA recreated %s", missing)
			}
		})
	}
}

func TestEnsureCAUnparsableRefused(t *testing.T) {
	for _, name := range []string{CACertFile, CAKeyFile} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mustCA(t, dir)
			path := filepath.Join(dir, name)
			if err := os.WriteFile(path, []byte("garbage\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := EnsureCA(dir)
			if err == nil {
				t.Fatal("EnsureCA accepted an unparsable file")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %s", err, path)
			}
			if b, _ := os.ReadFile(path); string(b) != "garbage\n" {
				t.Error("EnsureCA overwrote the unparsable file")
			}
		})
	}
}

func TestServerCertSANsAndVerify(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir)
	hosts := []string{"corral.example.test", "Localhost", "10.1.2.3", "[::1]", " ", "10.1.2.3"}
	tc, err := ca.EnsureServerCert(dir, hosts)
	if err != nil {
		t.Fatal(err)
	}
	leaf := tc.Leaf
	if leaf == nil {
		t.Fatal("tls.Certificate has no Leaf")
	}
	if want := []string{"corral.example.test", "localhost"}; !slices.Equal(leaf.DNSNames, want) {
		t.Errorf("DNSNames = %v, want %v", leaf.DNSNames, want)
	}
	for _, want := range []string{"10.1.2.3", "::1"} {
		if !slices.ContainsFunc(leaf.IPAddresses, net.ParseIP(want).Equal) {
			t.Errorf("IPAddresses %v missing %s", leaf.IPAddresses, want)
		}
	}
	if len(leaf.IPAddresses) != 2 {
		t.Errorf("IPAddresses = %v, want exactly two (deduplicated)", leaf.IPAddresses)
	}
	for _, eku := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if !slices.Contains(leaf.ExtKeyUsage, eku) {
			t.Errorf("ExtKeyUsage %v missing %v", leaf.ExtKeyUsage, eku)
		}
	}
	if d := time.Until(leaf.NotAfter); d < 700*24*time.Hour || d > 731*24*time.Hour {
		t.Errorf("server validity %v, want about two years", d)
	}

	for _, name := range []string{"corral.example.test", "localhost", "10.1.2.3", "::1"} {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName:   name,
			Roots:     ca.Pool(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			t.Errorf("Verify(%s): %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other.example.test", Roots: ca.Pool()}); err == nil {
		t.Error("Verify accepted a host not in the SANs")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: mustCA(t, t.TempDir()).Pool()}); err == nil {
		t.Error("Verify accepted the certificate against a different CA")
	}
}

func TestServerCertReuseAndReissue(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir)
	first, err := ca.EnsureServerCert(dir, []string{"localhost", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}

	// Same or fewer hosts: reused as is.
	again, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Error("server certificate reissued although it already covered the hosts")
	}

	// A new SAN forces a reissue.
	added, err := ca.EnsureServerCert(dir, []string{"localhost", "127.0.0.1", "corral.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	if added.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("server certificate not reissued after adding a SAN")
	}
	if !slices.Contains(added.Leaf.DNSNames, "corral.example.test") {
		t.Errorf("reissued DNSNames = %v", added.Leaf.DNSNames)
	}
	onDisk, err := tls.LoadX509KeyPair(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if onDisk.Leaf.SerialNumber.Cmp(added.Leaf.SerialNumber) != 0 {
		t.Error("reissued certificate was not written to disk")
	}
	if got := fileMode(t, filepath.Join(dir, ServerKeyFile)); got != 0o600 {
		t.Errorf("reissued server.key mode = %o, want 600", got)
	}
}

func TestServerCertReissuedForOtherCA(t *testing.T) {
	dir := t.TempDir()
	caA := mustCA(t, t.TempDir())
	caB := mustCA(t, t.TempDir())
	a, err := caA.EnsureServerCert(dir, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := caB.EnsureServerCert(dir, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Leaf.SerialNumber.Cmp(b.Leaf.SerialNumber) == 0 {
		t.Fatal("certificate signed by another CA was reused")
	}
	if err := b.Leaf.CheckSignatureFrom(caB.cert); err != nil {
		t.Errorf("reissued certificate not signed by the new CA: %v", err)
	}
}

func TestServerCertReissuedNearExpiry(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, dir)
	first, err := ca.EnsureServerCert(dir, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if !ca.serverCertFits(first.Leaf, nil, []string{"localhost"}, true, time.Now()) {
		t.Fatal("fresh certificate does not fit")
	}
	if ca.serverCertFits(first.Leaf, nil, []string{"localhost"}, true, first.Leaf.NotAfter.Add(-29*24*time.Hour)) {
		t.Error("certificate expiring within 30 days still fits")
	}
}

func TestServerCertNoHosts(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	if _, err := ca.EnsureServerCert(t.TempDir(), []string{" ", ""}); err == nil {
		t.Error("EnsureServerCert accepted an empty host list")
	}
}

func TestIssueClientCert(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	certPEM, keyPEM, err := ca.IssueClientCert("node-42", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if tc.Leaf.Subject.CommonName != "node-42" {
		t.Errorf("CommonName = %q", tc.Leaf.Subject.CommonName)
	}
	if _, err := tc.Leaf.Verify(x509.VerifyOptions{
		Roots:     ca.Pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		t.Errorf("client certificate does not verify: %v", err)
	}
	if d := time.Until(tc.Leaf.NotAfter); d > 24*time.Hour {
		t.Errorf("validity %v exceeds the requested 24h", d)
	}

	if _, _, err := ca.IssueClientCert("", time.Hour); err == nil {
		t.Error("empty common name accepted")
	}
	if _, _, err := ca.IssueClientCert("n", 0); err == nil {
		t.Error("zero validity accepted")
	}
	// Validity is capped at the CA's expiry.
	long, _, err := ca.IssueClientCert("n", 50*365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := parseCertPEM(long)
	if leaf.NotAfter.After(ca.cert.NotAfter) {
		t.Errorf("client certificate outlives the CA: %v > %v", leaf.NotAfter, ca.cert.NotAfter)
	}
}

func TestFingerprint(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	fp, err := Fingerprint(ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	if len(fp) != 64 || strings.ToLower(fp) != fp {
		t.Errorf("fingerprint %q is not 64 lowercase hex digits", fp)
	}
	if again, _ := Fingerprint(ca.CertPEM()); again != fp {
		t.Error("fingerprint not stable")
	}
	if other, _ := Fingerprint(mustCA(t, t.TempDir()).CertPEM()); other == fp {
		t.Error("different CAs share a fingerprint")
	}
	if _, err := Fingerprint([]byte("not pem")); err == nil {
		t.Error("Fingerprint accepted non-PEM input")
	}
}

func TestPoolIsFresh(t *testing.T) {
	ca := mustCA(t, t.TempDir())
	p := ca.Pool()
	p.AppendCertsFromPEM(mustCA(t, t.TempDir()).CertPEM())
	if ca.Pool().Equal(p) {
		t.Error("Pool returned shared state")
	}
	pem := ca.CertPEM()
	pem[0] = 'X'
	if ca.CertPEM()[0] == 'X' {
		t.Error("CertPEM returned shared state")
	}
}

func TestLocalHosts(t *testing.T) {
	hosts := LocalHosts()
	for _, want := range []string{"localhost", "127.0.0.1", "::1"} {
		if !slices.Contains(hosts, want) {
			t.Errorf("LocalHosts() = %v, missing %s", hosts, want)
		}
	}
	if name, err := os.Hostname(); err == nil && !slices.ContainsFunc(hosts, func(h string) bool { return strings.EqualFold(h, name) }) {
		t.Errorf("LocalHosts() = %v, missing hostname %s", hosts, name)
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		if seen[strings.ToLower(h)] {
			t.Errorf("LocalHosts() repeats %s", h)
		}
		seen[strings.ToLower(h)] = true
	}
	// Every entry must be usable as a SAN.
	ca := mustCA(t, t.TempDir())
	if _, err := ca.EnsureServerCert(filepath.Join(t.TempDir(), "not", "yet"), hosts); err != nil {
		t.Errorf("EnsureServerCert(LocalHosts()): %v", err)
	}
}
