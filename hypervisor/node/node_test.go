package node

import (
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"net"
	"sync"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/corralhq/corral/testsupport/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
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

func needTools(t *testing.T) {
	t.Helper()
	require.Root(t, "taps, namespaces")
	require.Tool(t, "qemu-system-x86_64", "qemu-img", "ip")
}
