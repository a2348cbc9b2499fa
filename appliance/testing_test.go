package appliance

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	"google.golang.org/grpc"
)

// startServer starts a real appliance (bbolt, TLS, tokens) on a loopback
// port in dataDir and returns it with its admin client config. The server
// stops when the test ends.
func startServer(t testing.TB, dataDir string) (*Server, *clientconfig.Config) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := New(Config{DataDir: dataDir, APIListen: "127.0.0.1:0", Logger: log})
	if err != nil {
		t.Fatalf("server.New: %v", err)
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
	cc, err := clientconfig.Load(filepath.Join(dataDir, AdminConfigFile))
	if err != nil {
		t.Fatalf("admin.conf: %v", err)
	}
	return srv, cc
}

// dial connects with cc, optionally replacing its token.
func dial(t testing.TB, cc *clientconfig.Config, token string) *grpc.ClientConn {
	t.Helper()
	c := *cc
	if token != "" {
		c.Token = token
	}
	conn, err := clientconfig.Dial(&c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func newToken(t testing.TB, srv *Server, role authv1.Role) string {
	t.Helper()
	tok, err := srv.Tokens().Create(context.Background(), role, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func loadAdmin(t testing.TB, dir string) (*clientconfig.Config, error) {
	t.Helper()
	cc, err := clientconfig.Load(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return cc, nil
}
