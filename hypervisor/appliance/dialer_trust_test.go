package appliance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakenode"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// revocationList is a CheckCert over a set of revoked serials.
type revocationList struct {
	mu      sync.Mutex
	revoked map[string]bool
}

func (r *revocationList) check(_ context.Context, c *x509.Certificate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.revoked[pki.Serial(c)] {
		return errors.New("revoked")
	}
	return nil
}

func (r *revocationList) revoke(c *x509.Certificate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revoked[pki.Serial(c)] = true
}

// TestMTLSDialerTrust: the appliance dials a node only if it presents its
// own node certificate (not another node's, not the appliance's server
// certificate) that is not revoked; a node revoked after the handshake is
// not called again on the cached connection.
func TestMTLSDialerTrust(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair := func(certPEM, keyPEM []byte, err error) tls.Certificate {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	n1 := pair(ca.IssueNodeCert("n1", nodeid.Organization))
	n2 := pair(ca.IssueNodeCert("n2", nodeid.Organization))
	upper := pair(ca.IssueNodeCert("N1", nodeid.Organization))
	applianceServer, err := ca.EnsureServerCert(dir, []string{"n1"})
	if err != nil {
		t.Fatal(err)
	}
	client := pair(ca.IssueClientCert("corral-appliance", time.Hour))

	st := mem.New()
	defer st.Close()
	p, err := pool.New(pool.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(cert tls.Certificate) uint32 {
		t.Helper()
		fake, err := fakenode.Start("n1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fake.Close() })
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		})))
		hypervisorv1.RegisterHypervisorServiceServer(srv, fake)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		return uint32(lis.Addr().(*net.TCPAddr).Port)
	}
	for name, tc := range map[string]struct {
		cert tls.Certificate
		want string // "" = the call works
	}{
		"its own node certificate":        {n1, ""},
		"another node's certificate":      {n2, "certificate"},
		"a case-variant node name":        {upper, "not its node certificate"},
		"the appliance's server identity": {applianceServer, "not its node certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			port := serve(tc.cert)
			if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", Address: "127.0.0.1", HypervisorPort: port, CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
				t.Fatal(err)
			}
			d := &MTLSDialer{Pool: p, TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS13}}
			defer d.Close()
			c, err := d.Hypervisor(ctx, "n1")
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = c.ListVolumes(cctx, &hypervisorv1.ListVolumesRequest{})
			if tc.want == "" && err != nil {
				t.Fatalf("ListVolumes: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("ListVolumes = %v, want an error with %q", err, tc.want)
			}
		})
	}

	// Revocation: at the handshake, and after it on the cached connection.
	port := serve(n1)
	if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", Address: "127.0.0.1", HypervisorPort: port, CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatal(err)
	}
	rl := &revocationList{revoked: map[string]bool{}}
	d := &MTLSDialer{Pool: p, TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS13}, CheckCert: rl.check}
	defer d.Close()
	c, err := d.Hypervisor(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListVolumes(ctx, &hypervisorv1.ListVolumesRequest{}); err != nil {
		t.Fatalf("before revocation: %v", err)
	}
	rl.revoke(n1.Leaf)
	if _, err := d.Hypervisor(ctx, "n1"); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("Hypervisor after revocation = %v, want PermissionDenied", err)
	}
	c, err = d.Hypervisor(ctx, "n1") // a new connection: the handshake refuses
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.ListVolumes(cctx, &hypervisorv1.ListVolumesRequest{}); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("ListVolumes to a revoked node = %v, want a refusal naming the revocation", err)
	}
}
