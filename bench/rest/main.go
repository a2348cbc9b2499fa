// Command rest compares the REST API (vanguard transcoding on the web
// listener) with gRPC for the same calls against the built corrald
// holding N inventoried machines: ListMachines (first page, default page
// size) and GetMachine. Rounds interleave the two (A, B, B, A, ...); each
// round makes the same number of calls of each; the medians over rounds
// of p50 and p99 latency, corrald's CPU per call (utime+stime from
// /proc), the client's CPU per call, and bytes on the wire per call (TLS
// included, both directions, counted at the client's socket) are printed.
// It asserts nothing.
//
//	go build -o /tmp/corral-bin/ ./cmd/corrald
//	go run ./bench/rest -bin /tmp/corral-bin -machines 5000 -rounds 5 -calls 200
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/bench/internal/benchd"
	"google.golang.org/grpc"
)

func main() {
	bin := flag.String("bin", "", "directory holding the built corrald (required)")
	n := flag.Int("machines", 5000, "machines in the store")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	calls := flag.Int("calls", 200, "calls of each kind per round")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "-bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *n, *rounds, *calls); err != nil {
		fmt.Fprintln(os.Stderr, "rest bench:", err)
		os.Exit(1)
	}
}

// counter counts a client's bytes on the wire.
type counter struct{ n atomic.Int64 }

type countedConn struct {
	net.Conn
	c *counter
}

func (cc countedConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	cc.c.n.Add(int64(n))
	return n, err
}

func (cc countedConn) Write(b []byte) (int, error) {
	n, err := cc.Conn.Write(b)
	cc.c.n.Add(int64(n))
	return n, err
}

func (c *counter) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return countedConn{conn, c}, nil
}

type sample struct {
	p50, p99, serverCPU, clientCPU, bytes float64 // ms, ms, µs, µs, bytes
}

func run(bin string, n, rounds, calls int) error {
	dir, err := os.MkdirTemp("", "corral-bench-rest")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The web listener on, and the same addresses both times.
	cfg := benchd.Config{Bin: bin, Dir: dir, API: benchd.FreeAddr(), Web: benchd.FreeAddr(), Ready: "serving web page"}
	web := cfg.Web
	d, err := benchd.Start(cfg)
	if err != nil {
		return err
	}
	d.Stop()
	t0 := time.Now()
	if err := benchd.Fill(filepath.Join(dir, "corral.db"), n, 8, nil); err != nil {
		return err
	}
	fmt.Printf("%d machines written offline in %v\n", n, time.Since(t0).Round(time.Millisecond))
	if d, err = benchd.Start(cfg); err != nil {
		return err
	}
	defer d.Stop()
	cc, err := clientconfig.Load(filepath.Join(dir, "admin.conf"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(cc.CACert))

	var gcount, rcount counter
	conn, err := clientconfig.Dial(cc, grpc.WithContextDialer(gcount.dial))
	if err != nil {
		return err
	}
	defer conn.Close()
	mc := inventoryv1.NewMachineServiceClient(conn)
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return rcount.dial(ctx, addr) },
		ForceAttemptHTTP2: true,
	}}
	ctx := context.Background()
	first, err := mc.ListMachines(ctx, &inventoryv1.ListMachinesRequest{PageSize: 1})
	if err != nil || len(first.GetMachines()) == 0 {
		return fmt.Errorf("list: %v", err)
	}
	name := first.GetMachines()[0].GetName()
	restGet := func(path string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+web+path, nil)
		req.Header.Set("Authorization", "Bearer "+cc.Token)
		res, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if _, err := io.Copy(io.Discard, res.Body); err != nil {
			return err
		}
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, res.Status)
		}
		return nil
	}
	type kind struct {
		name string
		cnt  *counter
		call func() error
	}
	for _, op := range []struct {
		name string
		a, b kind
	}{
		{"ListMachines", kind{"gRPC", &gcount, func() error { _, err := mc.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); return err }},
			kind{"REST", &rcount, func() error { return restGet("/v1/machines") }}},
		{"GetMachine", kind{"gRPC", &gcount, func() error { _, err := mc.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name}); return err }},
			kind{"REST", &rcount, func() error { return restGet("/v1/machines/" + name) }}},
	} {
		// Warm both connections and caches.
		for range 5 {
			if err := cmp.Or(op.a.call(), op.b.call()); err != nil {
				return err
			}
		}
		got := map[string][]sample{}
		for r := range rounds {
			order := []kind{op.a, op.b}
			if r%2 == 1 {
				order = []kind{op.b, op.a}
			}
			for _, k := range order {
				s, err := measure(d, k.cnt, calls, k.call)
				if err != nil {
					return fmt.Errorf("%s %s: %w", k.name, op.name, err)
				}
				got[k.name] = append(got[k.name], s)
			}
		}
		for _, k := range []string{"gRPC", "REST"} {
			ss := got[k]
			med := func(f func(sample) float64) float64 {
				var v []float64
				for _, s := range ss {
					v = append(v, f(s))
				}
				slices.Sort(v)
				return v[len(v)/2]
			}
			fmt.Printf("%-12s %-4s  p50 %7.2f ms  p99 %7.2f ms  corrald CPU %7.0f µs/call  client CPU %6.0f µs/call  wire %8.0f B/call\n",
				op.name, k, med(func(s sample) float64 { return s.p50 }), med(func(s sample) float64 { return s.p99 }),
				med(func(s sample) float64 { return s.serverCPU }), med(func(s sample) float64 { return s.clientCPU }),
				med(func(s sample) float64 { return s.bytes }))
		}
	}
	fmt.Printf("(%d machines, %d rounds × %d calls each, medians over rounds; load %s)\n", n, rounds, calls, loadAvg())
	return nil
}

// measure makes calls sequential calls.
func measure(d *benchd.Daemon, c *counter, calls int, call func() error) (sample, error) {
	lat := make([]float64, 0, calls)
	s0, c0, b0 := d.CPU(), selfCPU(), c.n.Load()
	for range calls {
		t := time.Now()
		if err := call(); err != nil {
			return sample{}, err
		}
		lat = append(lat, float64(time.Since(t))/float64(time.Millisecond))
	}
	s1, c1, b1 := d.CPU(), selfCPU(), c.n.Load()
	slices.Sort(lat)
	return sample{
		p50:       lat[len(lat)/2],
		p99:       lat[min(len(lat)-1, len(lat)*99/100)],
		serverCPU: float64(s1-s0) / float64(time.Microsecond) / float64(calls),
		clientCPU: float64(c1-c0) / float64(time.Microsecond) / float64(calls),
		bytes:     float64(b1-b0) / float64(calls),
	}, nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
