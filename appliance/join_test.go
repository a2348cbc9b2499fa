package appliance

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// nodeKey is a node's key and a CSR for it.
type nodeKey struct {
	key *ecdsa.PrivateKey
	csr string
}

func newNodeKey(t testing.TB, tmpl *x509.CertificateRequest) nodeKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return nodeKey{key: key, csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))}
}

// pair is the TLS certificate of a Join answer with k's key.
func (k nodeKey) pair(t testing.TB, certPEM string) tls.Certificate {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair([]byte(certPEM), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialCert connects to the appliance presenting cert (no token), verifying
// it as the CLI does.
func dialCert(t testing.TB, cc *clientconfig.Config, cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(cc.CACert))
	conf := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		VerifyConnection: clientconfig.VerifyApplianceConnection}
	conn, err := grpc.NewClient(cc.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func nodeToken(t testing.TB, srv *Server, node string) string {
	t.Helper()
	tok, _, err := srv.Tokens().CreateBound(context.Background(), auth.TokenSpec{Role: authv1.Role_ROLE_NODE, Description: "test", Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func join(conn *grpc.ClientConn, name, csr string) (*nodev1.JoinResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nodev1.NewAgentServiceClient(conn).Join(ctx, &nodev1.JoinRequest{Name: name, CsrPem: csr})
}

// TestJoinRules: what a node token, a node certificate and an admin may
// join as.
func TestJoinRules(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	k := newNodeKey(t, nil)
	admin := dial(t, cc, "")

	// A first node, joined with a token: the base for the cases below.
	resp, err := join(dial(t, cc, nodeToken(t, srv, "")), "node-1", k.csr)
	if err != nil {
		t.Fatal(err)
	}
	node1 := dialCert(t, cc, k.pair(t, resp.GetCertPem()))
	if _, err := poolv1.NewNodeServiceClient(admin).ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "pooled", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Inventory().CreateMachine(ctx, &inventoryv1.Machine{Name: "rack1-u1"}); err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]struct {
		conn *grpc.ClientConn
		node string
		csr  string
		want codes.Code
		msg  string
	}{
		"IPv4 literal":                       {dial(t, cc, nodeToken(t, srv, "")), "10.0.0.7", k.csr, codes.InvalidArgument, "IP address"},
		"short IPv4 form":                    {dial(t, cc, nodeToken(t, srv, "")), "127.1", k.csr, codes.InvalidArgument, "IP address"},
		"malformed name":                     {dial(t, cc, nodeToken(t, srv, "")), "a/b", k.csr, codes.InvalidArgument, "malformed"},
		"garbage CSR":                        {dial(t, cc, nodeToken(t, srv, "")), "node-9", "garbage", codes.InvalidArgument, "csr_pem"},
		"token bound to another name":        {dial(t, cc, nodeToken(t, srv, "node-2")), "node-3", k.csr, codes.PermissionDenied, `bound to node "node-2"`},
		"token for an existing node":         {dial(t, cc, nodeToken(t, srv, "")), "node-1", k.csr, codes.PermissionDenied, "already exists"},
		"bound token for an existing node":   {dial(t, cc, nodeToken(t, srv, "node-1")), "node-1", k.csr, codes.PermissionDenied, "already exists"},
		"token for a pool node":              {dial(t, cc, nodeToken(t, srv, "")), "pooled", k.csr, codes.PermissionDenied, "a node in the pool"},
		"token for a machine's name":         {dial(t, cc, nodeToken(t, srv, "")), "rack1-u1", k.csr, codes.PermissionDenied, "a machine"},
		"viewer token":                       {dial(t, cc, newToken(t, srv, authv1.Role_ROLE_VIEWER)), "node-4", k.csr, codes.PermissionDenied, ""},
		"node certificate for another name":  {node1, "node-2", k.csr, codes.PermissionDenied, "only its own name"},
		"node certificate renewing itself":   {node1, "node-1", newNodeKey(t, nil).csr, codes.OK, ""},
		"admin re-joining an existing node":  {admin, "node-1", newNodeKey(t, nil).csr, codes.OK, ""},
		"bound token for its name":           {dial(t, cc, nodeToken(t, srv, "node-5")), "node-5", k.csr, codes.OK, ""},
		"admin joining a name a token can't": {admin, "pooled", k.csr, codes.OK, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := join(tc.conn, tc.node, tc.csr)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Join(%q) = %v, want %v", tc.node, err, tc.want)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("message %q lacks %q", status.Convert(err).Message(), tc.msg)
			}
		})
	}
	issued, err := srv.Revocations().Issued(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	var via []string
	for _, e := range issued {
		via = append(via, e.GetVia())
	}
	slices.Sort(via)
	if d := cmp.Diff([]string{"join", "join", "renew"}, via); d != "" {
		t.Errorf("node-1 certificates on record (-want +got):\n%s", d)
	}
}

// TestJoinTokenSingleUse: a node token buys one certificate, also when
// two Joins race with it; a refused Join does not consume it.
func TestJoinTokenSingleUse(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	tok := nodeToken(t, srv, "")
	conn := dial(t, cc, tok)
	k := newNodeKey(t, nil)
	if _, err := join(conn, "10.1.1.1", k.csr); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("refused Join: %v", err)
	}
	if _, err := join(conn, "node-a", k.csr); err != nil {
		t.Fatalf("Join after a refused one: %v", err)
	}
	if _, err := join(conn, "node-b", k.csr); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("second Join with the token = %v, want Unauthenticated", err)
	}

	race := nodeToken(t, srv, "")
	var wg sync.WaitGroup
	codesSeen := make([]codes.Code, 8)
	for i := range codesSeen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := join(dial(t, cc, race), "racer-"+string(rune('a'+i)), k.csr)
			codesSeen[i] = status.Code(err)
		}()
	}
	wg.Wait()
	ok := 0
	for _, c := range codesSeen {
		switch c {
		case codes.OK:
			ok++
		case codes.Unauthenticated:
		default:
			t.Errorf("racing Join: %v", c)
		}
	}
	if ok != 1 {
		t.Errorf("%d racing Joins with one token got a certificate (%v), want exactly 1", ok, codesSeen)
	}
	n := 0
	for i := range codesSeen {
		issued, _ := srv.Revocations().Issued(context.Background(), "racer-"+string(rune('a'+i)))
		n += len(issued)
	}
	if n != 1 {
		t.Errorf("%d certificates recorded for the racers, want 1", n)
	}
}

// TestJoinIgnoresCSRSANs: the certificate carries the name as its only
// SAN whatever the request asks for; the node it makes is not the
// appliance to a client that trusts the CA.
func TestJoinIgnoresCSRSANs(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	u, _ := url.Parse("urn:corral:appliance")
	k := newNodeKey(t, &x509.CertificateRequest{
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, URIs: []*url.URL{u},
	})
	resp, err := join(dial(t, cc, nodeToken(t, srv, "")), "node-1", k.csr)
	if err != nil {
		t.Fatal(err)
	}
	leaf := k.pair(t, resp.GetCertPem()).Leaf
	if len(leaf.IPAddresses) != 0 || len(leaf.URIs) != 0 || !cmp.Equal(leaf.DNSNames, []string{"node-1"}) {
		t.Errorf("SANs DNS %v IP %v URI %v, want DNS [node-1] only", leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
	}
	if d := time.Until(leaf.NotAfter); d > pki.NodeValidity {
		t.Errorf("validity %v > %v", d, pki.NodeValidity)
	}
}

// TestNodeTokenOnlyJoins: a node token is for Join only.
func TestNodeTokenOnlyJoins(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	conn := dial(t, cc, nodeToken(t, srv, ""))
	_, err := poolv1.NewNodeServiceClient(conn).GetNode(context.Background(), &poolv1.GetNodeRequest{Name: "x"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "only be used to Join") {
		t.Fatalf("GetNode with a node token = %v", err)
	}
}
