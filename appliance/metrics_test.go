package appliance

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/machinefacts"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestMetricsHealthAndNotify runs a real appliance with the metrics
// listener on loopback and a real unixgram NOTIFY_SOCKET: /healthz,
// /readyz and /metrics answer, every gRPC service is SERVING, systemd
// hears READY=1, WATCHDOG=1 and, at shutdown, STOPPING=1, after which the
// services are NOT_SERVING.
func TestMetricsHealthAndNotify(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "200000") // WATCHDOG=1 every 100 ms
	t.Setenv("WATCHDOG_PID", "")
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Metrics: MetricsConfig{Listen: "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	base := "http://" + srv.MetricsAddr().String()

	waitNotify(t, msgs, "READY=1")
	waitNotify(t, msgs, "WATCHDOG=1")
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/nope": 404} {
		code, body := httpGet(t, base+path)
		if code != want {
			t.Errorf("GET %s: %d %q, want %d", path, code, body, want)
		}
	}
	// A write through the appliance's store is timed.
	if _, err := srv.store.Put(context.Background(), "/test/metrics", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	// A report over a cap is counted by reason.
	over := machinefacts.QEMU("SN-M", "", "52:54:00:00:0f:01")
	for range inventory.DefaultFactCaps.Disks + 1 {
		over.Disks = append(over.Disks, &inventoryv1.Facts_Disk{Name: "sdx"})
	}
	if err := srv.inv.CheckReport("52:54:00:00:0f:01", over); err == nil {
		t.Fatal("a report over the disk cap passed")
	}
	_, body := httpGet(t, base+"/metrics")
	for _, family := range []string{"corral_machines{", "corral_nodes{", `corral_store_commit_seconds_bucket{op="put",outcome="ok"`, "go_goroutines", "process_cpu_seconds_total",
		`corral_report_refusals_total{reason="disks"} 1`, `corral_deploys_total{outcome="deployed"} 0`} {
		if !strings.Contains(body, family) {
			t.Errorf("/metrics lacks %s", family)
		}
	}

	cc, err := clientconfig.Load(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(dial(t, cc, ""))
	for name := range srv.grpc.GetServiceInfo() {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v %v, want SERVING", name, r.GetStatus(), err)
		}
	}
	// The API call above is counted by the gRPC middleware.
	_, body = httpGet(t, base+"/metrics")
	if !strings.Contains(body, `corral_api_grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"}`) {
		t.Errorf("/metrics does not count the health Check call")
	}

	cancel()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	waitNotify(t, msgs, "STOPPING=1")
	if st, err := srv.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ""}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after shutdown: %v %v, want NOT_SERVING", st.GetStatus(), err)
	}
}

func waitNotify(t *testing.T, msgs <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("notify socket closed before %s", want)
			}
			for _, line := range strings.Split(m, "\n") {
				if line == want {
					return
				}
			}
		case <-timeout:
			t.Fatalf("no %s on the notify socket within 10s", want)
		}
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}
