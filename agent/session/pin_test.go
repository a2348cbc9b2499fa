package session

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/nodeid"
)

// TestPinnedTLSRefusesNodeCertificate: the discovery agent pins the
// appliance CA, which also signs node certificates; a server presenting a
// node certificate (for the very name dialled, CA in the chain) is
// refused, the appliance's server certificate is accepted.
func TestPinnedTLSRefusesNodeCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(ca.CertPEM())
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.EnsureServerCert(dir, []string{"appliance.test"})
	if err != nil {
		t.Fatal(err)
	}
	nodePEM, nodeKey, err := ca.IssueNodeCert("appliance.test", nodeid.Organization)
	if err != nil {
		t.Fatal(err)
	}
	node, err := tls.X509KeyPair(nodePEM, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cert tls.Certificate
		want error // nil: accepted
	}{
		"appliance server certificate": {server, nil},
		"node certificate":             {node, clientconfig.ErrNotAppliance},
	} {
		t.Run(name, func(t *testing.T) {
			cert := tc.cert
			cert.Certificate = append(cert.Certificate[:1:1], caCert.Raw) // CA in the chain
			lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			go func() {
				c, err := lis.Accept()
				if err == nil {
					_ = c.(*tls.Conn).Handshake()
					c.Close()
				}
			}()
			cfg := PinnedTLS(Fingerprint(caCert), nil)
			cfg.ServerName = "appliance.test"
			conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
			if conn != nil {
				conn.Close()
			}
			if tc.want == nil && err != nil {
				t.Fatalf("handshake: %v", err)
			}
			if tc.want != nil && (err == nil || !errors.Is(err, tc.want)) {
				t.Fatalf("handshake = %v, want %v", err, tc.want)
			}
		})
	}
}
