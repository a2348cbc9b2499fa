package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// nodeServer is a trivial NodeService: ListNodes returns an empty list,
// GetNode names the caller ("<role>/<subject>"), everything else is
// Unimplemented.
type nodeServer struct {
	poolv1.UnimplementedNodeServiceServer
}

func (nodeServer) ListNodes(ctx context.Context, _ *poolv1.ListNodesRequest) (*poolv1.ListNodesResponse, error) {
	if _, ok := FromContext(ctx); !ok {
		return nil, status.Error(codes.Internal, "no principal in context")
	}
	return &poolv1.ListNodesResponse{}, nil
}

func (nodeServer) GetNode(ctx context.Context, _ *poolv1.GetNodeRequest) (*poolv1.Node, error) {
	p, ok := FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal in context")
	}
	return &poolv1.Node{Name: p.Role.String() + "/" + p.Subject}, nil
}

// syncBuffer is a buffer safe for concurrent writers and the test.
type syncBuffer = syncbuf.Buffer

// testServer is corrald's gRPC stack in miniature, on a 127.0.0.1 listener
// with a server certificate from auth/pki.
type testServer struct {
	addr string
	ca   *pki.CA
}

// startServer serves NodeService, health and reflection behind ic. When
// clientCAs is set, client certificates are verified against it if given.
func startServer(t *testing.T, ic *Interceptor, clientCAs *x509.CertPool) testServer {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatalf("EnsureCA: %v", err)
	}
	cert, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatalf("EnsureServerCert: %v", err)
	}
	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		tlsConf.ClientCAs = clientCAs
		tlsConf.ClientAuth = tls.VerifyClientCertIfGiven
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConf)),
		grpc.ChainUnaryInterceptor(ic.Unary()),
		grpc.ChainStreamInterceptor(ic.Stream()),
	)
	poolv1.RegisterNodeServiceServer(srv, nodeServer{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return testServer{addr: lis.Addr().String(), ca: ca}
}

// dial connects to ts trusting its CA, with extra options.
func (ts testServer) dial(t *testing.T, extra ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: ts.addr, CACert: string(ts.ca.CertPEM())}, extra...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// call is one RPC a test case makes.
type call func(ctx context.Context, conn *grpc.ClientConn) error

var (
	listNodes call = func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := poolv1.NewNodeServiceClient(conn).ListNodes(ctx, &poolv1.ListNodesRequest{})
		return err
	}
	getNode call = func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := poolv1.NewNodeServiceClient(conn).GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
		return err
	}
	deleteNode call = func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := poolv1.NewNodeServiceClient(conn).DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: "n1"})
		return err
	}
	healthCheck call = func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// listServices is a streaming call through the reflection service.
	listServices call = func(ctx context.Context, conn *grpc.ClientConn) error {
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		req := &reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
		}
		// On io.EOF from Send the stream has ended; its status comes from
		// Recv (grpc.ClientStream contract).
		if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = stream.Recv()
		return err
	}
)

func TestInterceptorOverTLS(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	tk.Now = nil // the server reads the real clock
	logs := &syncBuffer{}
	ic := &Interceptor{Tokens: tk, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	ts := startServer(t, ic, nil)
	conn := ts.dial(t)

	mint := func(role authv1.Role) string {
		return mustCreate(t, tk, role, strings.ToLower(role.String()), time.Hour)
	}
	viewer := mint(authv1.Role_ROLE_VIEWER)
	operator := mint(authv1.Role_ROLE_OPERATOR)
	admin := mint(authv1.Role_ROLE_ADMIN)
	node := mint(authv1.Role_ROLE_NODE)
	agent := mint(authv1.Role_ROLE_AGENT)
	past := &Tokens{Store: tk.Store, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }}
	expired := mustCreate(t, past, authv1.Role_ROLE_ADMIN, "expired", time.Hour)
	revoked := mint(authv1.Role_ROLE_ADMIN)
	if err := tk.Revoke(context.Background(), revoked[4:20]); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	tokens := []string{viewer, operator, admin, node, agent, expired, revoked}

	bearer := func(tok string) []string { return []string{"Bearer " + tok} }
	tests := map[string]struct {
		auth    []string // authorization metadata values
		call    call
		want    codes.Code
		wantMsg []string // substrings of the status message
	}{
		"no token":                    {call: listNodes, want: codes.Unauthenticated},
		"empty bearer":                {auth: []string{"Bearer "}, call: listNodes, want: codes.Unauthenticated},
		"basic scheme":                {auth: []string{"Basic " + viewer}, call: listNodes, want: codes.Unauthenticated},
		"token without scheme":        {auth: []string{viewer}, call: listNodes, want: codes.Unauthenticated},
		"malformed token":             {auth: bearer("crl_nope"), call: listNodes, want: codes.Unauthenticated},
		"unknown id":                  {auth: bearer("crl_0123456789abcdef_" + viewer[21:]), call: listNodes, want: codes.Unauthenticated},
		"expired token":               {auth: bearer(expired), call: listNodes, want: codes.Unauthenticated, wantMsg: []string{"expired"}},
		"revoked token":               {auth: bearer(revoked), call: listNodes, want: codes.Unauthenticated},
		"two authorization values":    {auth: []string{"Bearer " + viewer, "Bearer " + admin}, call: listNodes, want: codes.Unauthenticated},
		"viewer ListNodes":            {auth: bearer(viewer), call: listNodes, want: codes.OK},
		"lowercase scheme":            {auth: []string{"bearer " + viewer}, call: listNodes, want: codes.OK},
		"viewer GetNode":              {auth: bearer(viewer), call: getNode, want: codes.OK},
		"viewer DeleteNode":           {auth: bearer(viewer), call: deleteNode, want: codes.PermissionDenied, wantMsg: []string{"/corral.pool.v1.NodeService/DeleteNode", "ROLE_OPERATOR"}},
		"operator ListNodes":          {auth: bearer(operator), call: listNodes, want: codes.OK},
		"operator DeleteNode":         {auth: bearer(operator), call: deleteNode, want: codes.Unimplemented},
		"admin DeleteNode":            {auth: bearer(admin), call: deleteNode, want: codes.Unimplemented},
		"node ListNodes":              {auth: bearer(node), call: listNodes, want: codes.PermissionDenied, wantMsg: []string{"/corral.pool.v1.NodeService/ListNodes", "only be used to Join"}},
		"node token GetNode":          {auth: bearer(node), call: getNode, want: codes.PermissionDenied, wantMsg: []string{"only be used to Join"}},
		"node DeleteNode":             {auth: bearer(node), call: deleteNode, want: codes.PermissionDenied},
		"agent GetNode":               {auth: bearer(agent), call: getNode, want: codes.PermissionDenied},
		"agent ListNodes":             {auth: bearer(agent), call: listNodes, want: codes.PermissionDenied},
		"health without token":        {call: healthCheck, want: codes.OK},
		"health with bad token":       {auth: bearer("crl_nope"), call: healthCheck, want: codes.OK},
		"reflection without token":    {call: listServices, want: codes.Unauthenticated},
		"reflection with bad token":   {auth: bearer(revoked), call: listServices, want: codes.Unauthenticated},
		"reflection with viewer":      {auth: bearer(viewer), call: listServices, want: codes.OK},
		"reflection with agent token": {auth: bearer(agent), call: listServices, want: codes.OK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, v := range tc.auth {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
			}
			err := tc.call(ctx, conn)
			st := status.Convert(err)
			if st.Code() != tc.want {
				t.Fatalf("code = %v (%v); want %v", st.Code(), err, tc.want)
			}
			for _, s := range tc.wantMsg {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("message %q does not contain %q", st.Message(), s)
				}
			}
			for _, tok := range tokens {
				if strings.Contains(st.Message(), tok[21:]) {
					t.Errorf("message %q contains a token secret", st.Message())
				}
			}
		})
	}

	out := logs.String()
	for _, tok := range tokens {
		if strings.Contains(out, tok[21:]) {
			t.Errorf("log contains the secret of %s:\n%s", tok[:20], out)
		}
	}
	for _, want := range []string{
		`msg="auth: permission denied" method=/corral.pool.v1.NodeService/DeleteNode role=ROLE_VIEWER token_id=` + viewer[4:20],
		`msg="auth: permission denied" method=/corral.pool.v1.NodeService/ListNodes role=ROLE_NODE token_id=` + node[4:20],
		`msg="auth: unauthenticated" method=/corral.pool.v1.NodeService/ListNodes role=ROLE_UNSPECIFIED token_id=` + revoked[4:20],
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestInterceptorPrincipalReachesHandler checks the handler sees who called.
func TestInterceptorPrincipalReachesHandler(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	tk.Now = nil
	ts := startServer(t, &Interceptor{Tokens: tk}, nil)
	tok := mustCreate(t, tk, authv1.Role_ROLE_OPERATOR, "alice", 0)
	// The token goes through clientconfig's per-RPC credentials this time.
	conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: ts.addr, CACert: string(ts.ca.CertPEM()), Token: tok})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()
	n, err := poolv1.NewNodeServiceClient(conn).GetNode(context.Background(), &poolv1.GetNodeRequest{})
	if err != nil {
		t.Fatalf("GetNode: %v", err)
	}
	if diff := cmp.Diff("ROLE_OPERATOR/alice", n.GetName()); diff != "" {
		t.Errorf("principal seen by handler (-want +got):\n%s", diff)
	}
}

// testCA issues client certificates with chosen subjects for mutual TLS.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test node CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func (ca *testCA) issue(t *testing.T, subject pkix.Name) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestInterceptorNodeCertificate(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	tk.Now = nil
	viewer := mustCreate(t, tk, authv1.Role_ROLE_VIEWER, "viewer", 0)
	nodeCA := newTestCA(t)
	nodeCert := nodeCA.issue(t, pkix.Name{CommonName: "node-17", Organization: []string{"acme", NodeOrganization}})
	plainCert := nodeCA.issue(t, pkix.Name{CommonName: "laptop", Organization: []string{"acme"}})
	noCN := nodeCA.issue(t, pkix.Name{Organization: []string{NodeOrganization}})

	enabled := startServer(t, &Interceptor{Tokens: tk, NodeCertificates: true}, nodeCA.pool())
	disabled := startServer(t, &Interceptor{Tokens: tk}, nodeCA.pool())

	tests := map[string]struct {
		server   testServer
		cert     *tls.Certificate
		token    string
		call     call
		want     codes.Code
		wantName string // GetNode's answer: the principal the handler saw
	}{
		"node certificate GetNode":         {server: enabled, cert: &nodeCert, call: getNode, want: codes.OK, wantName: "ROLE_NODE/node-17"},
		"node certificate ListNodes":       {server: enabled, cert: &nodeCert, call: listNodes, want: codes.PermissionDenied},
		"certificate without organization": {server: enabled, cert: &plainCert, call: getNode, want: codes.Unauthenticated},
		"node certificate without CN":      {server: enabled, cert: &noCN, call: getNode, want: codes.Unauthenticated},
		"no certificate":                   {server: enabled, call: getNode, want: codes.Unauthenticated},
		"token wins over certificate":      {server: enabled, cert: &nodeCert, token: viewer, call: getNode, want: codes.OK, wantName: "ROLE_VIEWER/viewer"},
		"token wins for ListNodes":         {server: enabled, cert: &nodeCert, token: viewer, call: listNodes, want: codes.OK},
		"bad token does not fall back":     {server: enabled, cert: &nodeCert, token: "crl_nope", call: getNode, want: codes.Unauthenticated},
		"rule disabled":                    {server: disabled, cert: &nodeCert, call: getNode, want: codes.Unauthenticated},
		"rule disabled, token still works": {server: disabled, cert: &nodeCert, token: viewer, call: getNode, want: codes.OK, wantName: "ROLE_VIEWER/viewer"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tlsConf := &tls.Config{RootCAs: tc.server.ca.Pool(), MinVersion: tls.VersionTLS12}
			if tc.cert != nil {
				tlsConf.Certificates = []tls.Certificate{*tc.cert}
			}
			conn, err := grpc.NewClient(tc.server.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)))
			if err != nil {
				t.Fatalf("NewClient: %v", err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.token)
			}
			if tc.wantName != "" {
				n, err := poolv1.NewNodeServiceClient(conn).GetNode(ctx, &poolv1.GetNodeRequest{})
				if err != nil {
					t.Fatalf("GetNode: %v", err)
				}
				if diff := cmp.Diff(tc.wantName, n.GetName()); diff != "" {
					t.Errorf("principal (-want +got):\n%s", diff)
				}
				return
			}
			if got := status.Code(tc.call(ctx, conn)); got != tc.want {
				t.Errorf("code = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestInterceptorUnverifiedCertificate: a certificate the TLS layer did not
// verify (no verified chain) never makes a NODE principal.
func TestInterceptorUnverifiedCertificate(t *testing.T) {
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "node-17", Organization: []string{NodeOrganization}},
		SerialNumber: big.NewInt(17), NotAfter: time.Now().Add(time.Hour)}
	tests := map[string]struct {
		state tls.ConnectionState
		want  codes.Code
	}{
		"verified":       {state: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}, VerifiedChains: [][]*x509.Certificate{{cert}}}, want: codes.OK},
		"unverified":     {state: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}, want: codes.Unauthenticated},
		"no certificate": {want: codes.Unauthenticated},
	}
	ic := &Interceptor{NodeCertificates: true}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tc.state}})
			var got Principal
			_, err := ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/corral.pool.v1.NodeService/GetNode"},
				func(ctx context.Context, _ any) (any, error) {
					got, _ = FromContext(ctx)
					return nil, nil
				})
			if code := status.Code(err); code != tc.want {
				t.Fatalf("code = %v (%v); want %v", code, err, tc.want)
			}
			if tc.want == codes.OK {
				if diff := cmp.Diff(Principal{Role: authv1.Role_ROLE_NODE, Subject: "node-17"}, got); diff != "" {
					t.Errorf("principal (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// fakeStream is a grpc.ServerStream with only a context.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s fakeStream) Context() context.Context { return s.ctx }

// TestInterceptorMethodsWithoutAccess calls the interceptors directly for
// methods gRPC would not route in the TLS test: ones the registry does not
// know and one whose descriptor has no access option. Only ADMIN passes.
func TestInterceptorMethodsWithoutAccess(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	tk.Now = nil
	tokens := map[authv1.Role]string{}
	for _, r := range []authv1.Role{authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN, authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT} {
		tokens[r] = mustCreate(t, tk, r, "", 0)
	}
	ic := &Interceptor{Tokens: tk, files: testFiles(t)}
	noTokens := &Interceptor{files: testFiles(t)}

	tests := map[string]struct {
		ic     *Interceptor
		method string
		// reached lists the roles whose calls reach the handler.
		reached []authv1.Role
	}{
		"no access option":       {ic: ic, method: "/test.bare.v1.Bare/Plain", reached: []authv1.Role{authv1.Role_ROLE_ADMIN}},
		"operator option":        {ic: ic, method: "/test.bare.v1.Bare/Guarded", reached: []authv1.Role{authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN}},
		"unknown method":         {ic: ic, method: "/test.bare.v1.Bare/Nope", reached: []authv1.Role{authv1.Role_ROLE_ADMIN}},
		"unknown service":        {ic: ic, method: "/no.such.v1.Service/Call", reached: []authv1.Role{authv1.Role_ROLE_ADMIN}},
		"garbage method":         {ic: ic, method: "nonsense", reached: []authv1.Role{authv1.Role_ROLE_ADMIN}},
		"no Tokens configured":   {ic: noTokens, method: "/test.bare.v1.Bare/Guarded"},
		"health needs no tokens": {ic: noTokens, method: "/grpc.health.v1.Health/Watch", reached: []authv1.Role{authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN, authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, kind := range []string{"unary", "stream"} {
				var got []authv1.Role
				for _, role := range []authv1.Role{authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN, authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT} {
					ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tokens[role]))
					reached := false
					var err error
					if kind == "unary" {
						_, err = tc.ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: tc.method},
							func(context.Context, any) (any, error) { reached = true; return nil, nil })
					} else {
						err = tc.ic.Stream()(nil, fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: tc.method},
							func(any, grpc.ServerStream) error { reached = true; return nil })
					}
					if reached != (err == nil) {
						t.Errorf("%s %v: reached=%v but err=%v", kind, role, reached, err)
					}
					if code := status.Code(err); err != nil && code != codes.PermissionDenied && code != codes.Unauthenticated {
						t.Errorf("%s %v: code %v; want PermissionDenied or Unauthenticated", kind, role, code)
					}
					if reached {
						got = append(got, role)
					}
				}
				if diff := cmp.Diff(tc.reached, got); diff != "" {
					t.Errorf("%s: roles reaching the handler (-want +got):\n%s", kind, diff)
				}
			}
		})
	}
	for _, m := range []string{"/test.bare.v1.Bare/Nope", "/no.such.v1.Service/Call", "nonsense"} {
		if _, ok := ic.access.Load(m); ok {
			t.Errorf("unknown method %q was cached", m)
		}
	}
	if _, ok := ic.access.Load("/test.bare.v1.Bare/Plain"); !ok {
		t.Error("known method /test.bare.v1.Bare/Plain was not cached")
	}
}
