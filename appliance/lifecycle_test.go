package appliance

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// TestInstallIdentityMTLS: the certificate an install's request gets
// (the key made by the node) lets the node apply its own Node over mTLS;
// the same identity from another CA is refused and applies nothing.
func TestInstallIdentityMTLS(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	nodeClient := func(certPEM, keyPEM []byte) poolv1.NodeServiceClient {
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(cc.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert}, RootCAs: srv.CA().Pool(), ServerName: "127.0.0.1",
		})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return poolv1.NewNodeServiceClient(conn)
	}
	id := caIdentity{srv}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "ignored"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := id.SignNode(ctx, "m-1", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}))
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if string(id.CACertPEM()) != string(srv.CA().CertPEM()) {
		t.Fatal("plan CA is not the appliance CA")
	}
	if _, err := nodeClient(certPEM, keyPEM).ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "m-1", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatalf("installed node applying itself: %v", err)
	}
	other, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fc, fk, err := other.IssueNodeCert("m-2", auth.NodeOrganization)
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodeClient(fc, fk).ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "m-2", CpuMilliCores: 1000, MemoryBytes: gib})
	if err == nil {
		t.Fatal("a node certificate from another CA was accepted")
	}
	admin := poolv1.NewNodeServiceClient(dial(t, cc, ""))
	if _, err := admin.GetNode(ctx, &poolv1.GetNodeRequest{Name: "m-2"}); status.Code(err) != codes.NotFound {
		t.Fatalf("foreign node applied: %v", err)
	}
}

// TestLifecycleRPCsWired: Accept, Reprovision and SetMaintenance answer
// (not Unimplemented) through the real server.
func TestLifecycleRPCsWired(t *testing.T) {
	_, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	c := inventoryv1.NewMachineServiceClient(dial(t, cc, ""))
	if _, err := c.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: "nope", Disk: "auto"}); status.Code(err) != codes.NotFound {
		t.Errorf("accept unknown: %v", err)
	}
	if _, err := c.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("reprovision unknown: %v", err)
	}
	if _, err := c.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: "nope", On: true}); status.Code(err) != codes.NotFound {
		t.Errorf("maintenance unknown: %v", err)
	}
}

func TestLifecycleConfigRefusesNegative(t *testing.T) {
	_, err := New(Config{DataDir: t.TempDir(), APIListen: "127.0.0.1:0", Lifecycle: LifecycleConfig{InstallTimeout: -1}})
	if err == nil {
		t.Fatal("negative --install-timeout accepted")
	}
}
