package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// fakeAppliance is an AgentService.Join and NodeService.ApplyNode over
// TLS with the appliance CA (auth/pki): Join signs with the token, or
// renews for a caller presenting a node certificate of the same name.
type fakeAppliance struct {
	nodev1.UnimplementedAgentServiceServer
	poolv1.UnimplementedNodeServiceServer
	ca       *pki.CA
	token    string
	validity time.Duration

	// applyErr, when set, is ApplyNode's answer (a refusal).
	applyErr error

	mu      sync.Mutex
	joins   int
	serials []string // client certificate serials seen by ApplyNode
}

func clientLeaf(ctx context.Context) *x509.Certificate {
	p, _ := peer.FromContext(ctx)
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

func (f *fakeAppliance) Join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	f.mu.Lock()
	f.joins++
	f.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	leaf := clientLeaf(ctx)
	switch {
	case leaf != nil && leaf.Subject.CommonName == req.GetName():
	case len(md.Get("authorization")) == 1 && md.Get("authorization")[0] == "Bearer "+f.token:
	default:
		return nil, status.Error(codes.Unauthenticated, "bad token")
	}
	certPEM, _, err := f.ca.SignNodeCSR([]byte(req.GetCsrPem()), req.GetName(), nodeid.Organization, f.validity)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &nodev1.JoinResponse{CertPem: string(certPEM), CaCertPem: string(f.ca.CertPEM())}, nil
}

func (f *fakeAppliance) ApplyNode(ctx context.Context, req *poolv1.ApplyNodeRequest) (*poolv1.Node, error) {
	leaf := clientLeaf(ctx)
	if leaf == nil {
		return nil, status.Error(codes.Unauthenticated, "no client certificate")
	}
	f.mu.Lock()
	f.serials = append(f.serials, pki.Serial(leaf))
	f.mu.Unlock()
	if f.applyErr != nil {
		return nil, f.applyErr
	}
	return &poolv1.Node{Name: req.GetName()}, nil
}

// startAppliance serves f on 127.0.0.1 presenting cert (nil: the CA's
// appliance server certificate).
func startAppliance(t *testing.T, f *fakeAppliance, cert *tls.Certificate) string {
	t.Helper()
	addr, _ := serveAppliance(t, f, cert)
	return addr
}

// serveAppliance is startAppliance, also returning the server (to stop it
// mid-test).
func serveAppliance(t *testing.T, f *fakeAppliance, cert *tls.Certificate) (string, *grpc.Server) {
	t.Helper()
	if cert == nil {
		c, err := f.ca.EnsureServerCert(t.TempDir(), []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		cert = &c
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{*cert}, ClientCAs: f.ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12,
	})))
	nodev1.RegisterAgentServiceServer(gs, f)
	poolv1.RegisterNodeServiceServer(gs, f)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), gs
}

func newFakeAppliance(t *testing.T) *fakeAppliance {
	t.Helper()
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &fakeAppliance{ca: ca, token: "crl_node_secret"}
}

func TestEnrol(t *testing.T) {
	f := newFakeAppliance(t)
	addr := startAppliance(t, f, nil)
	dir := t.TempDir()
	ctx := context.Background()
	cfg := EnrolConfig{Name: "node-1", DataDir: dir, Join: addr, Token: "wrong", CACertPEM: f.ca.CertPEM()}

	if _, err := Enrol(ctx, cfg); err == nil {
		t.Fatal("wrong token accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, nodeid.Dir, nodeid.KeyFile)); !os.IsNotExist(err) {
		t.Errorf("failed enrolment left a key: %v", err)
	}
	cfg.Token = f.token
	id, err := Enrol(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if leaf := id.Certificate.Leaf; leaf.Subject.CommonName != "node-1" || len(leaf.IPAddresses) != 0 {
		t.Errorf("certificate %v %v", leaf.Subject, leaf.IPAddresses)
	}
	for f, want := range map[string]os.FileMode{"": 0o700, nodeid.KeyFile: 0o600, nodeid.CertFile: 0o600, nodeid.CAFile: 0o600} {
		st, err := os.Stat(filepath.Join(dir, nodeid.Dir, f))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v mode %v, want %v", f, err, st.Mode().Perm(), want)
		}
	}
	// The stored identity dials the appliance with its certificate.
	reg, err := id.Registry(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := reg.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-1"}); err != nil {
		t.Fatalf("ApplyNode with the node certificate: %v", err)
	}
	// Second start: stored identity, no token, no appliance needed.
	joins := f.joins
	id2, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: f.ca.CertPEM()})
	if err != nil || f.joins != joins || !id2.Certificate.Leaf.Equal(id.Certificate.Leaf) {
		t.Fatalf("reload: %v (joins %d -> %d)", err, joins, f.joins)
	}
	// A different CA: the stored identity is not silently replaced.
	other := newFakeAppliance(t)
	if _, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: other.ca.CertPEM(), Name: "n", Join: "x:1", Token: "t"}); err == nil {
		t.Error("identity from another CA accepted")
	}
}

// TestNodeRefusesNodeCertificateAsAppliance: a server presenting a
// certificate of the appliance CA that is not the appliance's (another
// node's, covering the address dialled) gets neither the token (Enrol)
// nor the node's calls (Registry).
func TestNodeRefusesNodeCertificateAsAppliance(t *testing.T) {
	f := newFakeAppliance(t)
	ctx := context.Background()
	// A genuine identity first, from the real appliance.
	dir := t.TempDir()
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: dir, Join: startAppliance(t, f, nil), Token: f.token, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	// The impostor: a node certificate named like the host the node dials.
	certPEM, keyPEM, err := f.ca.IssueNodeCert("localhost", nodeid.Organization)
	if err != nil {
		t.Fatal(err)
	}
	impostorCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	impostor := &fakeAppliance{ca: f.ca, token: f.token}
	addr := startAppliance(t, impostor, &impostorCert)
	_, port, _ := net.SplitHostPort(addr)
	target := net.JoinHostPort("localhost", port)

	_, err = Enrol(ctx, EnrolConfig{Name: "node-2", DataDir: t.TempDir(), Join: target, Token: f.token, CACertPEM: f.ca.CertPEM()})
	if err == nil || !strings.Contains(err.Error(), clientconfig.ErrNotAppliance.Error()) {
		t.Fatalf("Enrol against a node certificate = %v, want %v", err, clientconfig.ErrNotAppliance)
	}
	reg, err := id.Registry(target)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := reg.ApplyNode(cctx, &poolv1.ApplyNodeRequest{Name: "node-1"}); status.Code(err) != codes.Unavailable ||
		!strings.Contains(err.Error(), "node certificate") {
		t.Fatalf("ApplyNode against a node certificate = %v, want Unavailable naming the node certificate", err)
	}
	if impostor.joins != 0 || len(impostor.serials) != 0 {
		t.Errorf("the impostor got %d joins and %d ApplyNode calls", impostor.joins, len(impostor.serials))
	}
}

// TestRenew: with a short validity the node renews at two thirds of it,
// stores the new pair, serves it and re-dials the appliance with it.
func TestRenew(t *testing.T) {
	f := newFakeAppliance(t)
	f.validity = 4 * time.Second
	addr := startAppliance(t, f, nil)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: dir, Join: addr, Token: f.token, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	first := id.Current().Leaf
	reg, err := id.Registry(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := reg.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-1"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- id.Renew(ctx, RenewConfig{Join: addr, Retry: 100 * time.Millisecond}) }()
	deadline := time.Now().Add(15 * time.Second)
	for id.Current().Leaf.Equal(first) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal within 15 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	renewed := id.Current().Leaf
	if renewed.Subject.CommonName != "node-1" || !renewed.NotAfter.After(first.NotAfter) {
		t.Errorf("renewed certificate %v until %v (first until %v)", renewed.Subject, renewed.NotAfter, first.NotAfter)
	}
	if got, _ := id.GetCertificate(nil); !got.Leaf.Equal(renewed) {
		t.Error("GetCertificate does not serve the renewed certificate")
	}
	if _, err := reg.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-1"}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	serials := append([]string(nil), f.serials...)
	f.mu.Unlock()
	if len(serials) != 2 || serials[0] != pki.Serial(first) || serials[1] == serials[0] {
		t.Errorf("ApplyNode client certificates %v, want the first then a renewed one", serials)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Renew = %v after cancel, want nil", err)
	}
	// A restart loads a renewed pair (maybe a later one than renewed).
	again, err := Enrol(context.Background(), EnrolConfig{DataDir: dir, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	if again.Certificate.Leaf.Equal(first) {
		t.Error("the renewed certificate was not stored")
	}
}

// TestLoadIdentityCompletesRenewal: a crash between the key rename and the
// certificate rename leaves the new key beside the old certificate and
// node.crt.new; loading completes the rename.
func TestLoadIdentityCompletesRenewal(t *testing.T) {
	f := newFakeAppliance(t)
	addr := startAppliance(t, f, nil)
	dir := t.TempDir()
	ctx := context.Background()
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: dir, Join: addr, Token: f.token, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := join(ctx, addr, "node-1", 0, id.DialOptions())
	if err != nil {
		t.Fatal(err)
	}
	idDir := filepath.Join(dir, nodeid.Dir)
	if err := os.WriteFile(filepath.Join(idDir, nodeid.KeyFile), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(idDir, nextCertFile), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatalf("load after an interrupted renewal: %v", err)
	}
	if got.Certificate.Leaf.Equal(id.Certificate.Leaf) {
		t.Error("loaded the old certificate")
	}
	if _, err := os.Stat(filepath.Join(idDir, nextCertFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind: %v", nextCertFile, err)
	}
	// A mismatched pair without a pending certificate is still an error.
	if err := os.Remove(filepath.Join(idDir, nodeid.CertFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(idDir, nodeid.CertFile), []byte(id.Certificate.Leaf.Raw), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Enrol(ctx, EnrolConfig{DataDir: dir, CACertPEM: f.ca.CertPEM()}); err == nil {
		t.Error("a broken identity loaded")
	}
}
