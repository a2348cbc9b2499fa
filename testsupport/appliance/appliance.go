// Package appliance runs the real Corral appliance (package appliance: bbolt,
// TLS, tokens, every service) in-process for one test, on a loopback port
// with a fresh data directory, and stops it when the test ends. Test
// support only.
package appliance

import (
	"context"
	"path/filepath"

	"github.com/corralhq/corral/appliance"
)

// Appliance is a running corrald.
type Appliance struct {
	Server  *appliance.Server
	DataDir string
	// AdminConf is the admin client configuration corrald wrote.
	AdminConf string
}

// T is what Start needs of a test: *testing.T and *testing.B have it,
// and so do the benchmark programs' stand-ins.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Option changes how Start runs the appliance.
type Option func(*options)

type options struct{ logRunError bool }

// RunErrorLogged makes an error from the server's Run at the end of the
// test a log line instead of a failure (for tests that break the
// appliance's peers on purpose).
func RunErrorLogged() Option { return func(o *options) { o.logRunError = true } }

// Start runs appliance.New(cfg) until the test ends. An empty cfg.DataDir is
// a fresh temporary directory, an empty cfg.APIListen 127.0.0.1:0. It
// fails the test when the server cannot be made; an error from Run when
// the test ends fails it too, unless RunErrorLogged.
func Start(t T, cfg appliance.Config, opts ...Option) *Appliance {
	t.Helper()
	var o options
	for _, f := range opts {
		f(&o)
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.APIListen == "" {
		cfg.APIListen = "127.0.0.1:0"
	}
	srv, err := appliance.New(cfg)
	if err != nil {
		t.Fatalf("appliance.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		err := <-done
		if err == nil {
			return
		}
		if e, ok := t.(interface{ Errorf(string, ...any) }); ok && !o.logRunError {
			e.Errorf("corrald Run: %v", err)
			return
		}
		t.Logf("corrald Run: %v", err)
	})
	return &Appliance{Server: srv, DataDir: cfg.DataDir, AdminConf: filepath.Join(cfg.DataDir, appliance.AdminConfigFile)}
}
