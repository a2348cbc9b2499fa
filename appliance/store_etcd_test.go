package appliance

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

func etcdConfig(c *etcdtest.Cluster, dir, name, prefix string) Config {
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("appliance", name)
	}
	return Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: log,
		Store: StoreConfig{Kind: StoreEtcd, Etcd: etcd.Options{Endpoints: c.Endpoints(), Prefix: prefix}, LeaseTTL: 2 * time.Second},
		Fleet: FleetConfig{Name: name}}
}

// runFleetServer runs srv until the returned stop is called (or the test
// ends).
func runFleetServer(t *testing.T, srv *Server) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// probe is a singleton that records which appliance runs it.
type probe struct {
	mu      sync.Mutex
	running map[string]bool
	starts  map[string]int
}

func (p *probe) singleton(name string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		p.mu.Lock()
		p.running[name] = true
		p.starts[name]++
		p.mu.Unlock()
		<-ctx.Done()
		p.mu.Lock()
		p.running[name] = false
		p.mu.Unlock()
		return nil
	}
}

func (p *probe) runners() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n, r := range p.running {
		if r {
			out = append(out, n)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, d)
	return 0
}

// TestFleetOnEtcd: two appliances on one etcd cluster. The first
// initialises the CA, seal key, tokens and admin.conf; the second joins only
// with the fleet's cluster key, serves the first one's admin client, and
// runs the singleton work only once the first stops.
func TestFleetOnEtcd(t *testing.T) {
	c := etcdtest.New(t, 3)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := New(etcdConfig(c, dirA, "a", "/fleet"))
	if err != nil {
		t.Fatal(err)
	}
	pr := &probe{running: map[string]bool{}, starts: map[string]int{}}
	a.addSingleton("probe", pr.singleton("a"))
	stopA := runFleetServer(t, a)
	ccA, err := clientconfig.Load(filepath.Join(dirA, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	// Without the cluster key, B is told what to copy.
	if _, err := New(etcdConfig(c, dirB, "b", "/fleet")); err == nil || !strings.Contains(err.Error(), ClusterKeyFile) || !strings.Contains(err.Error(), `appliance "a"`) {
		t.Fatalf("B without the cluster key: %v", err)
	}
	// Another fleet's key is refused.
	wrong := filepath.Join(t.TempDir(), "other.key")
	if _, err := ensureClusterKey(wrong); err != nil {
		t.Fatal(err)
	}
	cfgWrong := etcdConfig(c, t.TempDir(), "b", "/fleet")
	cfgWrong.Store.ClusterKeyFile = wrong
	if _, err := New(cfgWrong); err == nil || !strings.Contains(err.Error(), "another fleet's key") {
		t.Fatalf("B with another fleet's key: %v", err)
	}
	key, err := os.ReadFile(filepath.Join(dirA, ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	// A data directory with a CA of its own is refused, not overwritten.
	dirC := t.TempDir()
	if _, err := pki.EnsureCA(filepath.Join(dirC, PKIDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirC, ClusterKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(etcdConfig(c, dirC, "c", "/fleet")); err == nil || !strings.Contains(err.Error(), "another CA certificate") {
		t.Fatalf("C with its own CA: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dirB, ClusterKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(etcdConfig(c, dirB, "b", "/fleet"))
	if err != nil {
		t.Fatalf("B with the cluster key: %v", err)
	}
	b.addSingleton("probe", pr.singleton("b"))
	runFleetServer(t, b)
	if _, err := os.Stat(filepath.Join(dirB, AdminConfigFile)); err == nil {
		t.Error("B wrote an admin.conf: the fleet's first appliance does, with the first admin token")
	}
	for _, f := range []string{filepath.Join(PKIDir, pki.CACertFile), filepath.Join(PKIDir, pki.CAKeyFile), seal.KeyFile} {
		x, _ := os.ReadFile(filepath.Join(dirA, f))
		y, _ := os.ReadFile(filepath.Join(dirB, f))
		if len(x) == 0 || string(x) != string(y) {
			t.Errorf("%s differs between the appliances", f)
		}
	}

	// A's admin client, pointed at B, is served: one CA, one token store.
	ccB := *ccA
	ccB.Endpoint = b.Addr().String()
	ctx := context.Background()
	if _, err := inventoryv1.NewMachineServiceClient(dial(t, &ccB, "")).ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); err != nil {
		t.Fatalf("A's admin client on B: %v", err)
	}
	for _, s := range []*Server{a, b} {
		if name, err := s.leadership.Leader(ctx); err != nil || name != "a" {
			t.Fatalf("Leader seen by %s = %q, %v; want a", s.cfg.Fleet.Name, name, err)
		}
	}
	waitFor(t, "a runs the singleton", 5*time.Second, func() bool { r := pr.runners(); return len(r) == 1 && r[0] == "a" })
	time.Sleep(500 * time.Millisecond)
	if r := pr.runners(); len(r) != 1 || r[0] != "a" {
		t.Fatalf("singleton running on %v, want only a", r)
	}

	// A stops (gracefully): B takes over the singleton work at once.
	start := time.Now()
	stopA()
	waitFor(t, "b runs the singleton", 5*time.Second, func() bool { r := pr.runners(); return len(r) == 1 && r[0] == "b" })
	t.Logf("singleton work moved to b %s after a stopped", time.Since(start))
	if name, err := b.leadership.Leader(ctx); err != nil || name != "b" {
		t.Fatalf("Leader = %q, %v; want b", name, err)
	}
}
