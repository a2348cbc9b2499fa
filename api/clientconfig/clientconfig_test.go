package clientconfig

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const testToken = "s3cr3t-token"

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestWriteLoadRoundTrip(t *testing.T) {
	ca, err := newTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{Endpoint: "corral.example.test:7443", CACert: string(ca.CertPEM()), Token: testToken}
	path := filepath.Join(t.TempDir(), "admin.conf")
	if err := want.Write(path); err != nil {
		t.Fatal(err)
	}
	if got := mode(t, path); got != 0o600 {
		t.Errorf("mode = %o, want 600", got)
	}
	raw, _ := os.ReadFile(path)
	for _, key := range []string{"endpoint:", "ca_cert:", "token:"} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("file lacks key %s:\n%s", key, raw)
		}
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *want {
		t.Errorf("Load = %+v, want %+v", got, want)
	}
}

func TestWriteTightensExistingMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.conf")
	if err := os.WriteFile(path, []byte("endpoint: old:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := (&Config{Endpoint: "new:2", Token: "t"}).Write(path); err != nil {
		t.Fatal(err)
	}
	if got := mode(t, path); got != 0o600 {
		t.Errorf("mode = %o, want 600", got)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Endpoint != "new:2" {
		t.Errorf("Endpoint = %q, want new:2", got.Endpoint)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only admin.conf", len(entries))
	}
}

func TestLoadRejects(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field":    "endpoint: a:1\ntoken: t\nserver: b:2\n",
		"duplicate field":  "endpoint: a:1\nendpoint: b:2\n",
		"missing endpoint": "token: t\n",
		"empty file":       "",
		"bad ca_cert":      "endpoint: a:1\nca_cert: not a certificate\n",
		"not yaml":         "endpoint: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "admin.conf")
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			if err == nil {
				t.Fatal("Load accepted the file")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %s", err, path)
			}
		})
	}
	missing := filepath.Join(t.TempDir(), "nope.conf")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load(missing) = %v, want an error naming the file", err)
	}
}

func TestWriteRejectsInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.conf")
	if err := (&Config{Token: "t"}).Write(path); err == nil {
		t.Error("Write accepted a config without endpoint")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Error("Write created a file for an invalid config")
	}
}

// server starts a TLS gRPC health server on 127.0.0.1 whose interceptor
// requires the bearer token; it returns the endpoint and the CA PEM.
func server(t *testing.T) (endpoint, caPEM string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := newTestCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.EnsureServerCert(dir, []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	requireToken := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+testToken {
			return nil, status.Errorf(codes.Unauthenticated, "authorization = %q", got)
		}
		return h(ctx, req)
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})),
		grpc.UnaryInterceptor(requireToken),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), string(ca.CertPEM())
}

func check(t *testing.T, cfg *Config) error {
	t.Helper()
	conn, err := Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health status = %v, want SERVING", resp.GetStatus())
	}
	return err
}

func TestDialTLSWithBearerToken(t *testing.T) {
	endpoint, caPEM := server(t)

	// Round trip through the file, as the CLI does.
	path := filepath.Join(t.TempDir(), "admin.conf")
	if err := (&Config{Endpoint: endpoint, CACert: caPEM, Token: testToken}).Write(path); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(t, cfg); err != nil {
		t.Fatalf("Check with the right token: %v", err)
	}

	for name, token := range map[string]string{"wrong token": "other", "no token": ""} {
		t.Run(name, func(t *testing.T) {
			err := check(t, &Config{Endpoint: endpoint, CACert: caPEM, Token: token})
			if status.Code(err) != codes.Unauthenticated {
				t.Errorf("Check = %v, want Unauthenticated", err)
			}
		})
	}
}

func TestDialRejectsOtherCA(t *testing.T) {
	endpoint, _ := server(t)
	other, err := newTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	err = check(t, &Config{Endpoint: endpoint, CACert: string(other.CertPEM()), Token: testToken})
	if err == nil {
		t.Fatal("Check succeeded against a server signed by an untrusted CA")
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Check = %v, want Unavailable with a certificate error", err)
	}
}

func TestDialOptionsErrors(t *testing.T) {
	if _, err := (&Config{Endpoint: "a:1", CACert: "junk"}).DialOptions(); err == nil {
		t.Error("DialOptions accepted a junk CA")
	}
	if _, err := Dial(nil); err == nil {
		t.Error("Dial accepted a nil config")
	}
	if _, err := Dial(&Config{}); err == nil {
		t.Error("Dial accepted an empty endpoint")
	}
	opts, err := (&Config{Endpoint: "a:1"}).DialOptions()
	if err != nil {
		t.Fatalf("DialOptions with system pool: %v", err)
	}
	if len(opts) != 1 {
		t.Errorf("DialOptions without token returned %d options, want 1 (no per-RPC credentials)", len(opts))
	}
}

func TestBearerToken(t *testing.T) {
	md, err := bearerToken("abc").GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if md["authorization"] != "Bearer abc" {
		t.Errorf("metadata = %v", md)
	}
	if !bearerToken("abc").RequireTransportSecurity() {
		t.Error("bearer token allowed over an insecure transport")
	}
}
