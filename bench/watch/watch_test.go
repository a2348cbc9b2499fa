// Package watch is the watch fan-out benchmark (print only, opt-in):
// 100 concurrent WatchMachines streams on the built corrald (its own
// process, TLS gRPC) while 1,000 machine updates happen; it prints the
// delivery latency p50/p99 (update call started → each watcher received
// the change) and corrald's CPU time over the run's wall time.
//
//	CORRAL_BENCH_WATCH=1 go test -count=1 -v -run TestWatchFanout ./bench/watch
//
// Knobs: CORRAL_BENCH_WATCHERS (100), CORRAL_BENCH_UPDATES (1000).
package watch

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"google.golang.org/grpc"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// cpuTime reads a process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) end at ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100, nil // USER_HZ = 100
}

func TestWatchFanout(t *testing.T) {
	if os.Getenv("CORRAL_BENCH_WATCH") == "" {
		t.Skip("benchmark: set CORRAL_BENCH_WATCH=1")
	}
	watchers, updates := envInt("CORRAL_BENCH_WATCHERS", 100), envInt("CORRAL_BENCH_UPDATES", 1000)
	const machines = 10

	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/corralhq/corral/cmd/corrald")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	addr := freeAddr(t)
	// Each watcher has a connection of its own, as 100 operators' clients
	// would (from as many addresses: lift the per-address cap).
	cmd := exec.Command(filepath.Join(bin, "corrald"), "serve", "--data-dir", dataDir, "--grpc-max-conns-per-ip", strconv.Itoa(watchers+16))
	cmd.Env = append(os.Environ(), "CORRAL_API_LISTEN="+addr)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "serving gRPC API") {
				once = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("corrald did not start")
	}
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(tok string) *grpc.ClientConn {
		conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: addr, CACert: cc.CACert, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin := dial(cc.Token)
	mc := inventoryv1.NewMachineServiceClient(admin)
	for i := range machines {
		rf := redfishtest.Start(t, "root", "bench-pass", &redfishtest.MemMachine{})
		if _, err := mc.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: fmt.Sprintf("m%02d", i), BmcAddress: rf.Host, BmcPort: uint32(rf.Port),
			BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: "root", BmcPassword: "bench-pass",
			BmcTlsSha256: rf.Fingerprint(), BootMac: fmt.Sprintf("52:54:00:be:00:%02x", i)}); err != nil {
			t.Fatal(err)
		}
	}
	viewer, err := authv1.NewTokenServiceClient(admin).CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_VIEWER, Description: "bench"})
	if err != nil {
		t.Fatal(err)
	}

	// The watchers, each on its own connection.
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	synced := make(chan struct{}, watchers)
	for range watchers {
		c := inventoryv1.NewMachineServiceClient(dial(viewer.GetToken()))
		s, err := c.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := 0
			for seen < updates {
				ev, err := s.Recv()
				if err != nil {
					t.Errorf("watcher: %v after %d updates", err, seen)
					return
				}
				if ev.GetType() == watchv1.EventType_SYNCED {
					synced <- struct{}{}
					continue
				}
				sent, ok := strings.CutPrefix(ev.GetMachine().GetStateReason(), "bench ")
				if !ok || ev.GetType() != watchv1.EventType_MODIFIED {
					continue
				}
				ns, _ := strconv.ParseInt(sent, 10, 64)
				d := time.Since(time.Unix(0, ns))
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				seen++
			}
		}()
	}
	for range watchers {
		<-synced
	}

	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	var calls []time.Duration
	var cmu sync.Mutex
	var uw sync.WaitGroup
	for i := range machines {
		uw.Add(1)
		go func() {
			defer uw.Done()
			for range updates / machines {
				start := time.Now()
				if _, err := mc.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: fmt.Sprintf("m%02d", i), On: true,
					Reason: fmt.Sprintf("bench %d", start.UnixNano())}); err != nil {
					t.Error(err)
					return
				}
				cmu.Lock()
				calls = append(calls, time.Since(start))
				cmu.Unlock()
			}
		}()
	}
	uw.Wait()
	writes := time.Since(begin)
	wg.Wait()
	wall := time.Since(begin)
	cpu1, _ := cpuTime(cmd.Process.Pid)

	slices.Sort(lat)
	slices.Sort(calls)
	q := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	fmt.Printf("watch fan-out: %d watchers, %d updates of %d machines on bbolt\n", watchers, updates, machines)
	fmt.Printf("  updates: %v (%.0f/s), call p50 %v p99 %v\n", writes.Round(time.Millisecond), float64(updates)/writes.Seconds(), q(calls, .5).Round(time.Microsecond), q(calls, .99).Round(time.Microsecond))
	fmt.Printf("  delivery (call start → watcher received), %d deliveries: p50 %v p99 %v max %v\n", len(lat), q(lat, .5).Round(time.Microsecond), q(lat, .99).Round(time.Microsecond), q(lat, 1).Round(time.Microsecond))
	fmt.Printf("  corrald CPU %v over %v wall = %.2f cores\n", (cpu1 - cpu0).Round(time.Millisecond), wall.Round(time.Millisecond), (cpu1-cpu0).Seconds()/wall.Seconds())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func netListen() (interface {
	Addr() net.Addr
	Close() error
}, error) {
	return net.Listen("tcp", "127.0.0.1:0")
}
