package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/auth/pki"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const fetchArtifact = "/corral.fleet.v1.ApplianceService/FetchArtifact"

// leafOf parses the first certificate of a PEM bundle.
func leafOf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInterceptorApplianceCertificate: a peer appliance's certificate (the
// fleet CA's server certificate, carrying the appliance identity) is an
// APPLIANCE principal, admitted where a method names ROLE_APPLIANCE and
// nowhere else; no node certificate becomes one, not even one whose CSR
// asked for the appliance URI or one a foreign CA forged with both.
func TestInterceptorApplianceCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	appliance := server.Leaf
	if appliance == nil {
		appliance, _ = x509.ParseCertificate(server.Certificate[0])
	}
	nodePEM, _, err := ca.IssueNodeCert("node-17", NodeOrganization)
	if err != nil {
		t.Fatal(err)
	}
	// A node asks, in its CSR, for the appliance identity.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse(clientconfig.ApplianceURI)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-18"}, URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	signedPEM, _, err := ca.SignNodeCSR(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), "node-18", NodeOrganization, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate the appliance presents to nodes has no identity.
	clientPEM, _, err := ca.IssueClientCert("corral-appliance", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A certificate with both the node organization and the appliance URI
	// (no Corral CA writes one) is a node's.
	forgedCA := newTestCA(t)
	forgedDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(99), Subject: pkix.Name{CommonName: "node-19", Organization: []string{NodeOrganization}},
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, forgedCA.cert, key.Public(), forgedCA.key)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := x509.ParseCertificate(forgedDER)

	on := &Interceptor{NodeCertificates: true}
	off := &Interceptor{}
	for name, tc := range map[string]struct {
		ic     *Interceptor
		leaf   *x509.Certificate
		method string
		want   codes.Code
		who    Principal // the principal the handler saw, when OK
	}{
		"appliance FetchArtifact":           {ic: on, leaf: appliance, method: fetchArtifact, want: codes.OK, who: Principal{Role: authv1.Role_ROLE_APPLIANCE, Subject: "corrald"}},
		"appliance ListNodes":               {ic: on, leaf: appliance, method: "/corral.pool.v1.NodeService/ListNodes", want: codes.PermissionDenied},
		"appliance DeleteNode":              {ic: on, leaf: appliance, method: "/corral.pool.v1.NodeService/DeleteNode", want: codes.PermissionDenied},
		"appliance, rule off":               {ic: off, leaf: appliance, method: fetchArtifact, want: codes.Unauthenticated},
		"node certificate FetchArtifact":    {ic: on, leaf: leafOf(t, nodePEM), method: fetchArtifact, want: codes.PermissionDenied},
		"node CSR asking for the identity":  {ic: on, leaf: leafOf(t, signedPEM), method: fetchArtifact, want: codes.PermissionDenied},
		"forged node+appliance certificate": {ic: on, leaf: forged, method: fetchArtifact, want: codes.PermissionDenied},
		"appliance's client cert for nodes": {ic: on, leaf: leafOf(t, clientPEM), method: fetchArtifact, want: codes.Unauthenticated},
		"no certificate":                    {ic: on, method: fetchArtifact, want: codes.Unauthenticated},
	} {
		t.Run(name, func(t *testing.T) {
			var state credentials.TLSInfo
			if tc.leaf != nil {
				state.State.PeerCertificates = []*x509.Certificate{tc.leaf}
				state.State.VerifiedChains = [][]*x509.Certificate{{tc.leaf}}
			}
			ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: state})
			var got Principal
			err := tc.ic.Stream()(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: tc.method, IsServerStream: true},
				func(_ any, ss grpc.ServerStream) error {
					got, _ = FromContext(ss.Context())
					return nil
				})
			if code := status.Code(err); code != tc.want {
				t.Fatalf("code = %v (%v); want %v", code, err, tc.want)
			}
			if tc.want == codes.OK {
				if diff := cmp.Diff(tc.who, got); diff != "" {
					t.Errorf("principal (-want +got):\n%s", diff)
				}
			}
		})
	}
	// The principal never comes from a token: no token has the role.
	if ValidRole(authv1.Role_ROLE_APPLIANCE) {
		t.Error("ROLE_APPLIANCE is a valid token role")
	}
}
