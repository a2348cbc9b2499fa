package appliance

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakenode"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// MTLSDialer reaches a node over real mutual TLS at the pool's address and
// hypervisor_port, caches the connection, and redials when the address
// changes.
func TestMTLSDialer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	nodePEM, nodeKey, err := ca.IssueNodeCert("n1", nodeid.Organization)
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.X509KeyPair(nodePEM, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueClientCert("appliance", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakenode.Start("n1")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	if _, err := fake.Client().CreateVolume(ctx, &hypervisorv1.CreateVolumeRequest{Name: "v", SizeBytes: 1}); err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	})))
	hypervisorv1.RegisterHypervisorServiceServer(srv, fake)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	port := uint32(lis.Addr().(*net.TCPAddr).Port)

	st := mem.New()
	defer st.Close()
	p, err := pool.New(pool.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(addr string) {
		if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", Address: addr, HypervisorPort: port, CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
			t.Fatal(err)
		}
	}
	apply("127.0.0.1")
	d := &MTLSDialer{Pool: p, TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{clientCert}, MinVersion: tls.VersionTLS13}}
	defer d.Close()
	c, err := d.Hypervisor(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.ListVolumes(ctx, &hypervisorv1.ListVolumesRequest{})
	if err != nil || len(l.GetVolumes()) != 1 {
		t.Fatalf("ListVolumes over mTLS = %v, %v", l, err)
	}
	if c2, _ := d.Hypervisor(ctx, "n1"); c2 != c {
		t.Fatal("connection not cached")
	}
	apply("localhost")
	c3, err := d.Hypervisor(ctx, "n1")
	if err != nil || c3 == c {
		t.Fatalf("no redial after address change: %v", err)
	}
	if _, err := c3.ListVolumes(ctx, &hypervisorv1.ListVolumesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Hypervisor(ctx, "n9"); err == nil {
		t.Fatal("unknown node dialed")
	}

	// A client without a certificate is refused by the node.
	bad := &MTLSDialer{Pool: p, TLS: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS13}}
	defer bad.Close()
	bc, err := bad.Hypervisor(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := bc.ListVolumes(cctx, &hypervisorv1.ListVolumesRequest{}); err == nil {
		t.Fatal("node accepted a client without a certificate")
	}
}
