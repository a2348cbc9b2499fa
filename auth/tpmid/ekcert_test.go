package tpmid_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/agent/tpm"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/tpmid"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/swtpm"
)

// manufactured makes a TPM as a manufacturer would ship it: swtpm_setup
// creates its EK and stores an EK certificate in NV, signed by a local CA
// (swtpm_localca) in dir/ca. It returns the open TPM and the CA files.
func manufactured(t *testing.T) (*tpm.Device, []string) {
	t.Helper()
	require.Tool(t, "swtpm", "swtpm_setup", "swtpm_localca")
	dir := t.TempDir()
	ca, state := filepath.Join(dir, "ca"), filepath.Join(dir, "state")
	for _, d := range []string{ca, state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"setup.conf":      fmt.Sprintf("create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = %s/localca.conf\ncreate_certs_tool_options = %s/localca.options\nactive_pcr_banks = sha256\n", dir, dir),
		"localca.conf":    fmt.Sprintf("statedir = %[1]s\nsigningkey = %[1]s/signkey.pem\nissuercert = %[1]s/issuercert.pem\ncertserial = %[1]s/certserial\n", ca),
		"localca.options": "--platform-manufacturer Corral\n--platform-version 2.1\n--platform-model Lab\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("swtpm_setup", "--tpm2", "--tpm-state", state, "--create-ek-cert", "--config", filepath.Join(dir, "setup.conf")).CombinedOutput()
	if err != nil {
		t.Fatalf("swtpm_setup: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sw, err := swtpm.Start(ctx, state, swtpm.Commands)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); sw.Stop() })
	rwc, err := sw.Dial()
	if err != nil {
		t.Fatal(err)
	}
	d, err := tpm.OpenChannel(rwc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, []string{filepath.Join(ca, "issuercert.pem"), filepath.Join(ca, "swtpm-localca-rootca-cert.pem")}
}

// otherCA writes a CA certificate that signed no TPM.
func otherCA(t *testing.T) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "Another TPM Maker"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEKCertificate: with --tpm-ek-ca, a TPM whose NV certificate chains
// to a configured CA proves its EK; the same TPM against another CA, and
// a TPM without a certificate, get no challenge.
func TestEKCertificate(t *testing.T) {
	d, cas := manufactured(t)
	req, err := d.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if len(req.GetEkCertificate()) == 0 {
		t.Fatal("the agent read no EK certificate from NV")
	}
	roots, err := tpmid.LoadCAs(cas)
	if err != nil {
		t.Fatal(err)
	}
	v := tpmid.New(tpmid.Config{EKRoots: roots})
	ch, err := v.Begin(bindA, req)
	if err != nil {
		t.Fatalf("a certified EK refused: %v", err)
	}
	secret, err := d.Activate(ch)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret})
	if err != nil {
		t.Fatalf("proof with a certified EK: %v", err)
	}
	cert, _ := x509.ParseCertificate(req.GetEkCertificate())
	if want, _ := tpmid.Identity(cert.PublicKey); ek != want {
		t.Fatalf("identity %s, want the certificate's key's %s", ek, want)
	}

	other, err := tpmid.LoadCAs([]string{otherCA(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpmid.New(tpmid.Config{EKRoots: other}).Begin(bindA, req); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("EK certificate from an unconfigured CA: %v, want ErrPermissionDenied", err)
	}
	plain, err := device(t).Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Begin(bindB, plain); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("no EK certificate with CAs configured: %v, want ErrPermissionDenied", err)
	}
}
