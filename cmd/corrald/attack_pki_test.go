package main

// Black-box attacks on the appliance's PKI and tokens, against the built
// corrald and corral binaries (TestMain builds them with -race): a real
// gRPC client over TLS on loopback, the corral CLI, and a TLS server in
// this process impersonating the appliance with a node certificate.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentsession "github.com/corralhq/corral/agent/session"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// pkiTarget is a running corrald and what the attacks need of it.
type pkiTarget struct {
	t       *testing.T
	dataDir string
	admin   *clientconfig.Config
}

func startPKICorrald(t *testing.T) *pkiTarget {
	t.Helper()
	needE2E(t)
	dataDir := t.TempDir()
	addr := freePort(t)
	startCorrald(t, dataDir, addr)
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	return &pkiTarget{t: t, dataDir: dataDir, admin: cc}
}

// corral runs the built CLI with the admin configuration.
func (p *pkiTarget) corral(args ...string) (string, error) {
	p.t.Helper()
	return runCmd(p.t, filepath.Join(binDir, "corral"), append([]string{"--config", filepath.Join(p.dataDir, "admin.conf")}, args...)...)
}

// nodeToken creates a node token with `corral token create`.
func (p *pkiTarget) nodeToken(args ...string) string {
	p.t.Helper()
	out, err := p.corral(append([]string{"token", "create", "--role", "node"}, args...)...)
	if err != nil || !strings.HasPrefix(out, "crl_") {
		p.t.Fatalf("corral token create --role node %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(out)
}

// dial connects as the CLI does, with token ("" = none).
func (p *pkiTarget) dial(token string) *grpc.ClientConn {
	p.t.Helper()
	conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: p.admin.Endpoint, CACert: p.admin.CACert, Token: token})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

// dialCert connects presenting a node certificate, no token.
func (p *pkiTarget) dialCert(cert tls.Certificate) *grpc.ClientConn {
	p.t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(p.admin.CACert))
	conn, err := grpc.NewClient(p.admin.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, VerifyConnection: clientconfig.VerifyApplianceConnection,
	})))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

// pkiCSR is a fresh key and a request carrying tmpl's (ignored) SANs.
type pkiCSR struct {
	key *ecdsa.PrivateKey
	pem string
}

func newPKICSR(t *testing.T, tmpl *x509.CertificateRequest) pkiCSR {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pkiCSR{key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))}
}

func (c pkiCSR) pair(t *testing.T, certPEM string) tls.Certificate {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair([]byte(certPEM), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

func pkiJoin(conn *grpc.ClientConn, name, csr string) (*nodev1.JoinResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return nodev1.NewAgentServiceClient(conn).Join(ctx, &nodev1.JoinRequest{Name: name, CsrPem: csr})
}

func pkiWant(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Fatalf("%s = %v, want %v with %q", what, err, code, text)
	}
}

// TestAttackPKIJoin: what an attacker holding a node token, or a node
// certificate, can get out of Join.
func TestAttackPKIJoin(t *testing.T) {
	p := startPKICorrald(t)
	appliance, _ := url.Parse(clientconfig.ApplianceURI)
	evil := newPKICSR(t, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "corrald", Organization: []string{"admins"}},
		DNSNames:    []string{"localhost", "corrald"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		URIs:        []*url.URL{appliance},
	})

	t.Run("IP literal names are refused and do not use the token", func(t *testing.T) {
		conn := p.dial(p.nodeToken())
		for _, name := range []string{"127.0.0.1", "127.1", "10.0.0.1"} {
			_, err := pkiJoin(conn, name, evil.pem)
			pkiWant(t, "Join "+name, err, codes.InvalidArgument, "IP address")
		}
		if _, err := pkiJoin(conn, "attack-ok", evil.pem); err != nil {
			t.Fatalf("the token after refused Joins: %v", err)
		}
	})

	var node1 tls.Certificate
	t.Run("CSR SANs are not copied; the token works once", func(t *testing.T) {
		conn := p.dial(p.nodeToken())
		resp, err := pkiJoin(conn, "node-1", evil.pem)
		if err != nil {
			t.Fatal(err)
		}
		node1 = evil.pair(t, resp.GetCertPem())
		leaf := node1.Leaf
		if len(leaf.IPAddresses) != 0 || len(leaf.URIs) != 0 || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "node-1" ||
			leaf.Subject.CommonName != "node-1" || len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != nodeid.Organization {
			t.Fatalf("issued subject %v DNS %v IP %v URI %v: the request's choices leaked", leaf.Subject, leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
		}
		if err := clientconfig.VerifyAppliance(leaf); err == nil {
			t.Fatal("the node certificate passes as the appliance")
		}
		_, err = pkiJoin(conn, "node-2", newPKICSR(t, &x509.CertificateRequest{}).pem)
		pkiWant(t, "second Join with the token", err, codes.Unauthenticated, "")
	})

	t.Run("a token bound to another name", func(t *testing.T) {
		_, err := pkiJoin(p.dial(p.nodeToken("--node", "node-7")), "node-8", evil.pem)
		pkiWant(t, "Join node-8 with a node-7 token", err, codes.PermissionDenied, `bound to node "node-7"`)
	})

	t.Run("a node certificate renews only its own name", func(t *testing.T) {
		conn := p.dialCert(node1)
		_, err := pkiJoin(conn, "node-9", newPKICSR(t, &x509.CertificateRequest{}).pem)
		pkiWant(t, "node-1 renewing node-9", err, codes.PermissionDenied, "only its own name")
		if _, err := pkiJoin(conn, "node-1", newPKICSR(t, &x509.CertificateRequest{}).pem); err != nil {
			t.Fatalf("node-1 renewing itself: %v", err)
		}
		// Nor may it call anything a node may not, as another node.
		_, err = poolv1.NewNodeServiceClient(conn).ApplyNode(context.Background(), &poolv1.ApplyNodeRequest{Name: "node-9", CpuMilliCores: 1000, MemoryBytes: 1 << 30})
		pkiWant(t, "node-1 applying node-9", err, codes.PermissionDenied, "")
	})

	t.Run("an existing node name cannot be joined again with a token", func(t *testing.T) {
		_, err := pkiJoin(p.dial(p.nodeToken()), "node-1", newPKICSR(t, &x509.CertificateRequest{}).pem)
		pkiWant(t, "Join node-1 again", err, codes.PermissionDenied, "already exists")
		_, err = pkiJoin(p.dial(p.nodeToken("--node", "node-1")), "node-1", newPKICSR(t, &x509.CertificateRequest{}).pem)
		pkiWant(t, "Join node-1 again with a bound token", err, codes.PermissionDenied, "already exists")
	})

	t.Run("a node token is good for Join only", func(t *testing.T) {
		_, err := poolv1.NewNodeServiceClient(p.dial(p.nodeToken())).ListNodes(context.Background(), &poolv1.ListNodesRequest{})
		pkiWant(t, "ListNodes with a node token", err, codes.PermissionDenied, "only be used to Join")
	})
}

// TestAttackPKINodeCertAsAppliance: a node certificate, even one named
// like the address clients dial, is refused as the appliance by the corral
// CLI, the discovery agent's pinned TLS and a Go client of clientconfig.
func TestAttackPKINodeCertAsAppliance(t *testing.T) {
	p := startPKICorrald(t)
	k := newPKICSR(t, &x509.CertificateRequest{})
	resp, err := pkiJoin(p.dial(p.nodeToken()), "localhost", k.pem)
	if err != nil {
		t.Fatal(err)
	}
	impostor := k.pair(t, resp.GetCertPem())
	block, _ := pem.Decode([]byte(p.admin.CACert))
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	impostor.Certificate = append(impostor.Certificate, ca.Raw) // as the appliance sends its CA
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{impostor}, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	target := net.JoinHostPort("localhost", port)

	t.Run("corral CLI", func(t *testing.T) {
		out, err := p.corral("--endpoint", target, "get", "nodes")
		if err == nil || !strings.Contains(out, "not the appliance's") {
			t.Fatalf("corral against the impostor: %v\n%s", err, out)
		}
		if strings.Contains(out, p.admin.Token) {
			t.Fatal("the CLI's output carries its token")
		}
	})
	t.Run("discovery agent pin", func(t *testing.T) {
		conf := agentsession.PinnedTLS(agentsession.Fingerprint(ca), nil)
		conf.ServerName = "localhost"
		conn, err := tls.Dial("tcp", target, conf)
		if err == nil {
			conn.Close()
			t.Fatal("the pinned agent TLS accepted a node certificate")
		}
		if !strings.Contains(err.Error(), clientconfig.ErrNotAppliance.Error()) {
			t.Fatalf("handshake: %v", err)
		}
	})
	t.Run("clientconfig Go client", func(t *testing.T) {
		conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: target, CACert: p.admin.CACert, Token: p.admin.Token})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		pkiWant(t, "health check at the impostor", err, codes.Unavailable, "not the appliance's")
	})
	t.Run("the real appliance still passes", func(t *testing.T) {
		if out, err := p.corral("get", "nodes"); err != nil {
			t.Fatalf("corral get nodes: %v\n%s", err, out)
		}
	})
}

// TestAttackPKIRevocation: a machine's node certificate stops working on
// its next call, on an open connection, once the machine is deleted; and a
// revoked token fails its next call.
func TestAttackPKIRevocation(t *testing.T) {
	p := startPKICorrald(t)
	ctx := context.Background()
	admin := p.dial(p.admin.Token)
	reg, err := nodev1.NewAgentServiceClient(admin).Register(ctx, &nodev1.RegisterRequest{
		BootMac: "52:54:00:aa:bb:01",
		Facts:   &inventoryv1.Facts{System: &inventoryv1.Facts_System{Serial: "ATTACK-PKI-1", Uuid: "7d2c3a0e-0000-4000-8000-000000000001"}},
	})
	if err != nil {
		t.Fatalf("Register (admin): %v", err)
	}
	machine := reg.GetMachineName()
	// A token cannot take the machine's name; an admin can (a manual node).
	_, err = pkiJoin(p.dial(p.nodeToken()), machine, newPKICSR(t, &x509.CertificateRequest{}).pem)
	pkiWant(t, "Join a machine's name with a token", err, codes.PermissionDenied, "a machine")
	k := newPKICSR(t, &x509.CertificateRequest{})
	resp, err := pkiJoin(admin, machine, k.pem)
	if err != nil {
		t.Fatal(err)
	}
	conn := p.dialCert(k.pair(t, resp.GetCertPem()))
	nodes := poolv1.NewNodeServiceClient(conn)
	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: machine, CpuMilliCores: 1000, MemoryBytes: 1 << 30}); err != nil {
		t.Fatalf("the node applying itself: %v", err)
	}
	if out, err := p.corral("machine", "reprovision", machine); err != nil {
		t.Fatalf("reprovision: %v\n%s", err, out)
	}
	_, err = nodes.GetNode(ctx, &poolv1.GetNodeRequest{Name: machine})
	pkiWant(t, "the node's next call after reprovision", err, codes.Unauthenticated, "revoked")
	_, err = poolv1.NewNodeServiceClient(p.dialCert(k.pair(t, resp.GetCertPem()))).GetNode(ctx, &poolv1.GetNodeRequest{Name: machine})
	pkiWant(t, "a new connection with the revoked certificate", err, codes.Unauthenticated, "revoked")

	// A token revoked while its connection is open.
	out, err := p.corral("token", "create", "--role", "viewer", "--description", "attack")
	if err != nil {
		t.Fatal(err, out)
	}
	viewer := strings.TrimSpace(out)
	vconn := poolv1.NewNodeServiceClient(p.dial(viewer))
	if _, err := vconn.ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil {
		t.Fatalf("viewer before revoke: %v", err)
	}
	if out, err := p.corral("token", "revoke", viewer[4:20]); err != nil {
		t.Fatalf("token revoke: %v\n%s", err, out)
	}
	_, err = vconn.ListNodes(ctx, &poolv1.ListNodesRequest{})
	pkiWant(t, "the revoked token's next call", err, codes.Unauthenticated, "")
	list, err := p.corral("token", "list", "--all", "-o", "json")
	if err != nil || strings.Contains(list, viewer[21:]) || strings.Contains(list, p.admin.Token[21:]) {
		t.Fatalf("token list: %v, or it shows a secret", err)
	}
	db, _ := os.ReadFile(filepath.Join(p.dataDir, "corral.db")) // the store holds hashes only
	if strings.Contains(string(db), viewer[21:]) {
		t.Fatal("the store holds a token secret")
	}
}
