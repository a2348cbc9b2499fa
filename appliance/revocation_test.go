package appliance

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/hypervisor/node"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// startServerWith starts an appliance with cfg (DataDir and APIListen
// filled) logging into the returned buffer.
func startServerWith(t *testing.T, cfg Config) (*Server, *clientconfig.Config, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.APIListen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	cc, err := clientconfig.Load(filepath.Join(cfg.DataDir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return srv, cc, logs
}

// TestRevokedOnDeleteAndReprovision: the certificates of a machine's node
// are revoked when the machine is reprovisioned or deleted, and the node's
// next call on its already open connection is Unauthenticated.
func TestRevokedOnDeleteAndReprovision(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	admin := dial(t, cc, "")
	machines := inventoryv1.NewMachineServiceClient(admin)
	for name, act := range map[string]func(name string) error{
		"delete": func(name string) error {
			_, err := machines.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: name})
			return err
		},
		"reprovision": func(name string) error {
			_, err := machines.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: name})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := "rack1-" + name
			if _, err := srv.Inventory().CreateMachine(ctx, &inventoryv1.Machine{Name: m}); err != nil {
				t.Fatal(err)
			}
			k := newNodeKey(t, nil)
			resp, err := join(admin, m, k.csr)
			if err != nil {
				t.Fatal(err)
			}
			cert := k.pair(t, resp.GetCertPem())
			conn := dialCert(t, cc, cert)
			nodes := poolv1.NewNodeServiceClient(conn)
			if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: m, CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
				t.Fatalf("the node applying itself: %v", err)
			}
			if err := act(m); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			_, err = nodes.GetNode(ctx, &poolv1.GetNodeRequest{Name: m})
			if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
				t.Fatalf("the node's next call after %s = %v, want Unauthenticated naming the revocation", name, err)
			}
			if err := srv.Revocations().Check(ctx, cert.Leaf); !errors.Is(err, auth.ErrRevoked) {
				t.Errorf("Check = %v, want ErrRevoked", err)
			}
			if issued, _ := srv.Revocations().Issued(ctx, m); len(issued) != 0 {
				t.Errorf("issued list after %s: %v", name, issued)
			}
			// A fresh connection is refused too.
			if _, err := poolv1.NewNodeServiceClient(dialCert(t, cc, cert)).GetNode(ctx, &poolv1.GetNodeRequest{Name: m}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("new connection with the revoked certificate: %v", err)
			}
		})
	}
	// Deleting a machine that is gone still revokes (a retry after a
	// failed revocation); an unknown machine is NotFound.
	if _, err := machines.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "never-was"}); status.Code(err) != codes.NotFound {
		t.Errorf("DeleteMachine(unknown) = %v, want NotFound", err)
	}
}

// TestTokenServiceOverTLS: tokens made, listed and revoked over the real
// API; a revocation takes effect on the next call of an open connection;
// a single-use token works once; no secret reaches a response or the log.
func TestTokenServiceOverTLS(t *testing.T) {
	srv, cc, logs := startServerWith(t, Config{})
	ctx := context.Background()
	tokens := authv1.NewTokenServiceClient(dial(t, cc, ""))

	created, err := tokens.CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_VIEWER, Description: "dashboard", TtlSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	viewer := created.GetToken()
	info := created.GetInfo()
	if info.GetRole() != authv1.Role_ROLE_VIEWER || info.GetExpiresUnix()-info.GetCreatedUnix() != 3600 || len(info.GetSha256()) != 0 {
		t.Errorf("created %v", info)
	}
	conn := dial(t, cc, viewer)
	nodes := poolv1.NewNodeServiceClient(conn)
	if _, err := nodes.ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil {
		t.Fatalf("call with the new token: %v", err)
	}
	if _, err := authv1.NewTokenServiceClient(conn).ListTokens(ctx, &authv1.ListTokensRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a viewer listing tokens: %v, want PermissionDenied", err)
	}

	single, err := tokens.CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_OPERATOR, SingleUse: true})
	if err != nil {
		t.Fatal(err)
	}
	once := poolv1.NewNodeServiceClient(dial(t, cc, single.GetToken()))
	if _, err := once.ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil {
		t.Fatalf("single-use token, first call: %v", err)
	}
	if _, err := once.ListNodes(ctx, &poolv1.ListNodesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("single-use token, second call: %v, want Unauthenticated", err)
	}

	if _, _, err := srv.Tokens().IssueBoot(ctx, "52:54:00:00:00:01", "m-525400000001", time.Hour); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		req       *authv1.ListTokensRequest
		wantAgent bool
	}{
		"default hides agent tokens": {&authv1.ListTokensRequest{}, false},
		"include_agent":              {&authv1.ListTokensRequest{IncludeAgent: true}, true},
		"role AGENT":                 {&authv1.ListTokensRequest{Role: authv1.Role_ROLE_AGENT}, true},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := tokens.ListTokens(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			agent := false
			for _, tk := range l.GetTokens() {
				agent = agent || tk.GetRole() == authv1.Role_ROLE_AGENT
				if len(tk.GetSha256()) != 0 {
					t.Errorf("token %s listed with its hash", tk.GetId())
				}
			}
			if agent != tc.wantAgent {
				t.Errorf("agent tokens listed: %v, want %v", agent, tc.wantAgent)
			}
		})
	}

	for name, req := range map[string]*authv1.CreateTokenRequest{
		"agent role":       {Role: authv1.Role_ROLE_AGENT},
		"no role":          {},
		"node on a viewer": {Role: authv1.Role_ROLE_VIEWER, Node: "n1"},
		"IP node name":     {Role: authv1.Role_ROLE_NODE, Node: "10.0.0.1"},
		"negative ttl":     {Role: authv1.Role_ROLE_VIEWER, TtlSeconds: -1},
		"huge description": {Role: authv1.Role_ROLE_VIEWER, Description: strings.Repeat("x", auth.MaxTokenDescription+1)},
		"malformed node":   {Role: authv1.Role_ROLE_NODE, Node: "a b"},
	} {
		if _, err := tokens.CreateToken(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: CreateToken = %v, want InvalidArgument", name, err)
		}
	}

	if _, err := tokens.RevokeToken(ctx, &authv1.RevokeTokenRequest{Id: info.GetId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.ListNodes(ctx, &poolv1.ListNodesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("next call after revoke on the open connection = %v, want Unauthenticated", err)
	}
	if _, err := tokens.RevokeToken(ctx, &authv1.RevokeTokenRequest{Id: info.GetId()}); status.Code(err) != codes.NotFound {
		t.Errorf("revoke twice = %v, want NotFound", err)
	}
	if _, err := tokens.RevokeToken(ctx, &authv1.RevokeTokenRequest{Id: "zz"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("revoke a malformed id = %v, want InvalidArgument", err)
	}
	out := logs.String()
	for _, secret := range []string{viewer[21:], single.GetToken()[21:]} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains a token secret")
		}
	}
	for _, want := range []string{`msg="token created" component=tokens token_id=` + info.GetId(), `msg="token revoked" component=tokens token_id=` + info.GetId()} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// TestApplianceClientCertRenewal: the appliance's client certificate for
// nodes is reissued at two thirds of its lifetime, without a restart; a
// node's handshake then gets the new one.
func TestApplianceClientCertRenewal(t *testing.T) {
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	now := time.Now()
	var mu sync.Mutex
	c := &clientCerts{ca: ca, cn: applianceClientCN, validity: 30 * 24 * time.Hour,
		log: slog.New(slog.NewTextHandler(logs, nil)), now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	// A node's TLS server records the client certificate of each handshake.
	srvCert, err := ca.EnsureServerCert(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	seen := make(chan string, 4)
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			tc := conn.(*tls.Conn)
			if tc.Handshake() == nil {
				seen <- pki.Serial(tc.ConnectionState().PeerCertificates[0])
			}
			conn.Close()
		}
	}()
	handshake := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: ca.Pool(), GetClientCertificate: c.get, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		select {
		case s := <-seen:
			return s
		case <-time.After(5 * time.Second):
			t.Fatal("no handshake seen")
			return ""
		}
	}
	first := handshake()
	advance(19 * 24 * time.Hour)
	if got := handshake(); got != first {
		t.Errorf("renewed before two thirds of the lifetime")
	}
	advance(2 * 24 * time.Hour) // 21 days: past 20
	second := handshake()
	if second == first {
		t.Fatal("not renewed after two thirds of the lifetime")
	}
	if !strings.Contains(logs.String(), "appliance client certificate renewed") {
		t.Errorf("no renewal log line:\n%s", logs)
	}
	// A short validity, on the real clock, through the server's config.
	short := &clientCerts{ca: ca, cn: applianceClientCN, validity: 3 * time.Second, log: slog.New(slog.DiscardHandler)}
	a, _ := short.get(nil)
	time.Sleep(2100 * time.Millisecond)
	b, _ := short.get(nil)
	if a.Leaf.Equal(b.Leaf) || time.Until(b.Leaf.NotAfter) < 2*time.Second {
		t.Errorf("short-lived client certificate not renewed at 2/3 (%v, %v)", a.Leaf.NotAfter, b.Leaf.NotAfter)
	}
}

// TestNodeRenewsAgainstAppliance: a node enrolled with a token renews its
// short-lived certificate through Join with its certificate (no token),
// keeps heartbeating on the renewed one, and its old certificate stays on
// record until it expires.
func TestNodeRenewsAgainstAppliance(t *testing.T) {
	srv, cc, _ := startServerWith(t, Config{PKI: PKIConfig{NodeCertValidity: 4 * time.Second}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	id, err := node.Enrol(ctx, node.EnrolConfig{Name: "node-r", DataDir: dir, Join: cc.Endpoint, Token: nodeToken(t, srv, "node-r"), CACertPEM: []byte(cc.CACert)})
	if err != nil {
		t.Fatal(err)
	}
	first := id.Current().Leaf
	reg, err := id.Registry(cc.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	done := make(chan error, 1)
	go func() { done <- id.Renew(ctx, node.RenewConfig{Join: cc.Endpoint, Retry: 200 * time.Millisecond}) }()
	deadline := time.Now().Add(20 * time.Second)
	for id.Current().Leaf.Equal(first) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Past the first certificate's expiry, the node still calls.
	time.Sleep(time.Until(first.NotAfter) + 500*time.Millisecond)
	if _, err := reg.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-r", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatalf("ApplyNode after the first certificate expired: %v", err)
	}
	issued, err := srv.Revocations().Issued(context.Background(), "node-r")
	if err != nil {
		t.Fatal(err)
	}
	renewed := 0
	for _, e := range issued {
		if e.GetVia() == "renew" {
			renewed++
		}
		if e.GetSerial() == pki.Serial(first) {
			t.Errorf("the expired first certificate is still listed as live")
		}
	}
	if renewed == 0 {
		t.Errorf("no renewal on record: %v", issued)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Renew: %v", err)
	}
	// An expired certificate's connection is refused per call.
	stale := id.Certificate
	conn := dialCert(t, cc, stale)
	if _, err := poolv1.NewNodeServiceClient(conn).GetNode(context.Background(), &poolv1.GetNodeRequest{Name: "node-r"}); err == nil {
		t.Error("a call with the expired first certificate succeeded")
	}
}
