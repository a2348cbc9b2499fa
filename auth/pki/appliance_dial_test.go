package pki_test

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/auth/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serveWith starts a TLS health server presenting cert.
func serveWith(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestDialRefusesNodeCertificate: a server presenting a certificate that
// chains to the appliance CA and covers the dialled name, but is not the
// appliance's (a node certificate, the appliance's own client
// certificate), is refused; the appliance's server certificate is
// accepted.
func TestDialRefusesNodeCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.EnsureServerCert(dir, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, nodeKey, err := ca.IssueNodeCert("localhost", clientconfig.NodeOrganization)
	if err != nil {
		t.Fatal(err)
	}
	node, err := tls.X509KeyPair(nodeCert, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	clientPEM, clientKey, err := ca.IssueClientCert("localhost", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := tls.X509KeyPair(clientPEM, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cert tls.Certificate
		want codes.Code
		msg  string
	}{
		"appliance server certificate": {server, codes.OK, ""},
		"node certificate":             {node, codes.Unavailable, "node certificate"},
		"appliance client certificate": {client, codes.Unavailable, "certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			addr := serveWith(t, tc.cert)
			_, port, _ := net.SplitHostPort(addr)
			conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: net.JoinHostPort("localhost", port), CACert: string(ca.CertPEM())})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("message %q lacks %q", status.Convert(err).Message(), tc.msg)
			}
		})
	}
}
