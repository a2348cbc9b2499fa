package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/corralhq/corral/testsupport/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type fakeRegistry struct {
	mu   sync.Mutex
	reqs []*poolv1.ApplyNodeRequest
}

func (f *fakeRegistry) ApplyNode(ctx context.Context, in *poolv1.ApplyNodeRequest, _ ...grpc.CallOption) (*poolv1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, in)
	return &poolv1.Node{Name: in.GetName()}, nil
}

func (f *fakeRegistry) calls() []*poolv1.ApplyNodeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*poolv1.ApplyNodeRequest(nil), f.reqs...)
}

func dialNode(t *testing.T, addr string, ca *testCA, cert *tls.Certificate) hypervisorv1.HypervisorServiceClient {
	t.Helper()
	conf := &tls.Config{RootCAs: ca.pool(), ServerName: "127.0.0.1"}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return hypervisorv1.NewHypervisorServiceClient(conn)
}

// TestRunMTLS: the service needs a client certificate from the CA, refuses
// node certificates, heartbeats ApplyNode with the node's capacity and
// stops cleanly.
func TestRunMTLS(t *testing.T) {
	ca := newTestCA(t)
	nodeCert := ca.issue(t, pkix.Name{CommonName: "node-1", Organization: []string{nodeid.Organization}})
	appliance := ca.issue(t, pkix.Name{CommonName: "corrald"})
	otherNode := ca.issue(t, pkix.Name{CommonName: "node-2", Organization: []string{nodeid.Organization}})
	foreign := newTestCA(t).issue(t, pkix.Name{CommonName: "corrald"})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Name: "node-1", DataDir: t.TempDir(), Listener: lis, CAPool: ca.pool(), Certificate: nodeCert,
			Registry: reg, Heartbeat: 50 * time.Millisecond, Rack: "r1", Labels: map[string]string{"zone": "a"},
			Accel: "tcg", SkipRestart: true,
		})
	}()
	addr := lis.Addr().String()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()

	if _, err := dialNode(t, addr, ca, &appliance).ListVMs(cctx, &hypervisorv1.ListVMsRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("appliance certificate: %v", err)
	}
	if _, err := dialNode(t, addr, ca, &otherNode).ListVMs(cctx, &hypervisorv1.ListVMsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("node certificate: %v, want PermissionDenied", err)
	}
	if _, err := dialNode(t, addr, ca, nil).ListVMs(cctx, &hypervisorv1.ListVMsRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("no certificate: %v, want a refused handshake (Unavailable)", err)
	}
	if _, err := dialNode(t, addr, ca, &foreign).ListVMs(cctx, &hypervisorv1.ListVMsRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("foreign CA: %v, want a refused handshake (Unavailable)", err)
	}
	if _, err := dialNode(t, addr, ca, &appliance).GetVM(cctx, &hypervisorv1.VMRequest{Name: "../etc"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("traversal name: %v, want InvalidArgument", err)
	}
	if _, err := dialNode(t, addr, ca, &appliance).GetVolume(cctx, &hypervisorv1.VolumeRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown volume: %v, want NotFound", err)
	}

	deadline := time.Now().Add(5 * time.Second)
	for len(reg.calls()) < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	calls := reg.calls()
	if len(calls) < 3 {
		t.Fatalf("%d heartbeats, want >= 3", len(calls))
	}
	r := calls[0]
	if r.GetName() != "node-1" || r.GetCpuMilliCores() == 0 || r.GetMemoryBytes() == 0 || r.GetStorageBytes() == 0 ||
		r.GetRack() != "r1" || r.GetLabels()["zone"] != "a" || r.GetHypervisorPort() != uint32(lis.Addr().(*net.TCPAddr).Port) || r.GetAddress() != "127.0.0.1" {
		t.Errorf("ApplyNode %v", r)
	}
	t.Logf("ApplyNode: cpu %d milli, memory %d MiB, storage %d GiB", r.GetCpuMilliCores(), r.GetMemoryBytes()>>20, r.GetStorageBytes()>>30)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestConfigRequired(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no name": {DataDir: "/x"}, "no dir": {Name: "n"}, "no tls": {Name: "n", DataDir: "/x"},
	} {
		if err := Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}

type joinServer struct {
	nodev1.UnimplementedAgentServiceServer
	ca    *testCA
	token string
	calls int
}

func (j *joinServer) Join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	j.calls++
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer "+j.token {
		return nil, status.Error(codes.Unauthenticated, "bad token")
	}
	block, _ := pem.Decode([]byte(req.GetCsrPem()))
	if block == nil {
		return nil, status.Error(codes.InvalidArgument, "no csr")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || csr.CheckSignature() != nil {
		return nil, status.Error(codes.InvalidArgument, "bad csr")
	}
	cert := j.ca.sign(nil, pkix.Name{CommonName: req.GetName(), Organization: []string{nodeid.Organization}}, csr.PublicKey, csr.DNSNames, csr.IPAddresses)
	return &nodev1.JoinResponse{CertPem: string(cert), CaCertPem: string(j.ca.pem)}, nil
}

func TestEnrol(t *testing.T) {
	ca := newTestCA(t)
	serverCert := ca.issue(t, pkix.Name{CommonName: "corrald"})
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}})))
	js := &joinServer{ca: ca, token: "crl_node_secret"}
	nodev1.RegisterAgentServiceServer(gs, js)
	go gs.Serve(lis)
	defer gs.Stop()
	dir := t.TempDir()
	ctx := context.Background()
	cfg := EnrolConfig{Name: "node-1", DataDir: dir, Join: lis.Addr().String(), Token: "wrong", CACertPEM: ca.pem, Hosts: []string{"10.0.0.5"}}

	if _, err := Enrol(ctx, cfg); err == nil {
		t.Fatal("wrong token accepted")
	} else {
		t.Logf("wrong token: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, nodeid.Dir, nodeid.KeyFile)); !os.IsNotExist(err) {
		t.Errorf("failed enrolment left a key: %v", err)
	}
	cfg.Token = js.token
	id, err := Enrol(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if id.Certificate.Leaf.Subject.CommonName != "node-1" || len(id.Certificate.Leaf.IPAddresses) != 1 {
		t.Errorf("certificate %v %v", id.Certificate.Leaf.Subject, id.Certificate.Leaf.IPAddresses)
	}
	for f, want := range map[string]os.FileMode{"": 0o700, nodeid.KeyFile: 0o600, nodeid.CertFile: 0o600, nodeid.CAFile: 0o600} {
		st, err := os.Stat(filepath.Join(dir, nodeid.Dir, f))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v mode %v, want %v", f, err, st.Mode().Perm(), want)
		}
	}
	// The stored identity dials the appliance with its certificate.
	conn, err := grpc.NewClient(lis.Addr().String(), id.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := nodev1.NewAgentServiceClient(conn).Join(ctx, &nodev1.JoinRequest{}); code(err) != codes.Unauthenticated {
		t.Errorf("call with the node identity (no token): %v, want the fake's Unauthenticated", err)
	}
	// Second start: stored identity, no token, no appliance needed.
	calls := js.calls
	id2, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: ca.pem})
	if err != nil || js.calls != calls || !id2.Certificate.Leaf.Equal(id.Certificate.Leaf) {
		t.Fatalf("reload: %v (calls %d -> %d)", err, calls, js.calls)
	}
	// A different CA: the stored identity is not silently replaced.
	if _, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: newTestCA(t).pem, Name: "n", Join: "x:1", Token: "t"}); err == nil {
		t.Error("identity from another CA accepted")
	}
}

func needTools(t *testing.T) {
	t.Helper()
	require.Root(t, "taps, namespaces")
	require.Tool(t, "qemu-system-x86_64", "qemu-img", "ip")
}
