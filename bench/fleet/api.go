package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// API round trips: the same closed-loop clients against one corrald on
// bbolt, one corrald on the 3-member etcd cluster, and two corrald on that
// cluster (another prefix) with the clients split between them.

// apiTarget is one column: its appliances and one connection per client.
type apiTarget struct {
	name  string
	apps  []*corrald
	conns []*grpc.ClientConn // client k uses conns[k]; k%len(apps) picks the appliance
}

// apiOp is one kind of call a client makes in a loop.
type apiOp struct {
	name string
	// shared: every client works on one node record (contention);
	// otherwise client k has its own node.
	shared bool
	// do makes one iteration's calls, reporting each call's latency.
	do func(ctx context.Context, c poolv1.NodeServiceClient, node string, k, i int, rec func(time.Duration, error))
}

func timed(rec func(time.Duration, error), call func() error) error {
	start := time.Now()
	err := call()
	rec(time.Since(start), err)
	return err
}

var apiOps = []apiOp{
	{name: "read", do: func(ctx context.Context, c poolv1.NodeServiceClient, node string, k, i int, rec func(time.Duration, error)) {
		_ = timed(rec, func() error { // rec has counted the error
			_, err := c.GetNode(ctx, &poolv1.GetNodeRequest{Name: node})
			return err
		})
	}},
	{name: "write", do: reserveRelease},
	{name: "write-shared", shared: true, do: reserveRelease},
}

// reserveRelease reserves one core and 1 GiB on node, then releases it:
// two writes of the node record (a compare-and-swap on etcd, bbolt's
// in-transaction update on bbolt).
func reserveRelease(ctx context.Context, c poolv1.NodeServiceClient, node string, k, i int, rec func(time.Duration, error)) {
	name := fmt.Sprintf("bench-c%d-%d", k, i)
	err := timed(rec, func() error {
		_, err := c.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: node, ComputeName: name,
			RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30})
		return err
	})
	if err != nil {
		return
	}
	_ = timed(rec, func() error { // rec has counted the error
		_, err := c.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: node, ComputeName: name})
		return err
	})
}

// maxSamples bounds the latencies kept per cell (the count goes on).
const maxSamples = 1 << 20

// cellResult is one measurement: calls/s and latency percentiles.
type cellResult struct {
	calls    int
	errs     int
	firstErr string
	rate     float64
	p50      time.Duration
	p99      time.Duration
}

// runCell runs clients closed-loop clients of op against t for warm +
// dur and measures the calls that start after warm.
func runCell(ctx context.Context, t *apiTarget, op apiOp, clients int, warm, dur time.Duration) cellResult {
	start := time.Now()
	from, end := start.Add(warm), start.Add(warm+dur)
	var mu sync.Mutex
	var res cellResult
	lat := make([]time.Duration, 0, 1<<14)
	var wg sync.WaitGroup
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := poolv1.NewNodeServiceClient(t.conns[k])
			node := nodeName(k)
			if op.shared {
				node = sharedNode
			}
			var mine []time.Duration
			calls, errs, firstErr := 0, 0, ""
			rec := func(d time.Duration, err error) {
				if time.Now().Add(-d).Before(from) {
					return
				}
				if err != nil {
					errs++
					if firstErr == "" {
						firstErr = status.Convert(err).Message()
					}
					return
				}
				calls++
				if len(mine) < maxSamples/clients {
					mine = append(mine, d)
				}
			}
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				op.do(ctx, c, node, k, i, rec)
			}
			mu.Lock()
			defer mu.Unlock()
			res.calls += calls
			res.errs += errs
			if res.firstErr == "" {
				res.firstErr = firstErr
			}
			lat = append(lat, mine...)
		}()
	}
	wg.Wait()
	res.rate = float64(res.calls) / dur.Seconds()
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return res
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

const sharedNode = "bench-shared"

func nodeName(k int) string { return fmt.Sprintf("bench-n%02d", k) }

// apiCell is one row of the table: an operation at a concurrency.
type apiCell struct {
	op      apiOp
	clients int
}

func (c apiCell) String() string { return fmt.Sprintf("%s, %d client(s)", c.op.name, c.clients) }

type apiConfig struct {
	repeats   int
	clients   []int
	warm, dur time.Duration
}

// benchAPI starts the three columns, runs every cell on each, interleaved
// (the columns' order rotates from one repeat to the next), prints every
// run and returns the summary table.
func benchAPI(ctx context.Context, out io.Writer, bin, root string, cl *etcdtest.Cluster, cfg apiConfig) (string, error) {
	maxClients := slices.Max(cfg.clients)
	// The nodes have no agent to heartbeat them: keep them READY (a
	// NOT_READY node takes no reservation) for the whole run.
	nodesStayReady := []string{"--node-heartbeat-timeout", "240h"}
	bolt, err := newCorrald(bin, root, "api-bolt", nodesStayReady...)
	if err != nil {
		return "", err
	}
	etcdFlags := func(prefix string) []string {
		return append([]string{"--store", "etcd", "--etcd-endpoints", cl.EndpointsFlag(), "--etcd-prefix", prefix}, nodesStayReady...)
	}
	one, err := newCorrald(bin, root, "api-etcd1", etcdFlags("/bench-api-one")...)
	if err != nil {
		return "", err
	}
	two := make([]*corrald, 2)
	for i := range two {
		if two[i], err = newCorrald(bin, root, fmt.Sprintf("api-etcd2-%c", 'a'+i), etcdFlags("/bench-api-two")...); err != nil {
			return "", err
		}
	}
	targets := []*apiTarget{{name: "bolt", apps: []*corrald{bolt}}, {name: "etcd", apps: []*corrald{one}}, {name: "etcd x2", apps: two}}
	defer func() {
		for _, t := range targets {
			for _, c := range t.conns {
				c.Close()
			}
			for _, a := range t.apps {
				a.stop()
			}
		}
	}()
	for _, t := range targets {
		cc, err := startFleet(t.apps)
		if err != nil {
			return "", fmt.Errorf("%s: %w", t.name, err)
		}
		for k := range maxClients {
			conn, err := dial(cc, t.apps[k%len(t.apps)].addr)
			if err != nil {
				return "", err
			}
			t.conns = append(t.conns, conn)
		}
		c := poolv1.NewNodeServiceClient(t.conns[0])
		for k := -1; k < maxClients; k++ {
			name := sharedNode
			if k >= 0 {
				name = nodeName(k)
			}
			if _, err := c.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: name, Address: "10.255.0.1",
				CpuMilliCores: 4_000_000, MemoryBytes: 1 << 50, StorageBytes: 1 << 50}); err != nil {
				return "", fmt.Errorf("%s: ApplyNode %s: %w", t.name, name, err)
			}
		}
	}
	var cells []apiCell
	for _, n := range cfg.clients {
		for _, op := range apiOps {
			if op.shared && n == 1 {
				continue // one client: the same as its own node
			}
			cells = append(cells, apiCell{op, n})
		}
	}
	// results[cell][target] over repeats.
	results := make([][][]cellResult, len(cells))
	for i := range results {
		results[i] = make([][]cellResult, len(targets))
	}
	fmt.Fprintf(out, "\n== API round trips: %d repeats x %d cells x columns, %v each (+%v warm-up), interleaved\n", cfg.repeats, len(cells), cfg.dur, cfg.warm)
	for r := range cfg.repeats {
		for ci, cell := range cells {
			for j := range targets {
				ti := (j + r) % len(targets)
				t := targets[ti]
				if cell.clients == 1 && len(t.apps) > 1 {
					continue // nothing to split
				}
				res := runCell(ctx, t, cell.op, cell.clients, cfg.warm, cfg.dur)
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				results[ci][ti] = append(results[ci][ti], res)
				errs := ""
				if res.errs > 0 {
					errs = fmt.Sprintf(", %d errors (%s)", res.errs, res.firstErr)
				}
				fmt.Fprintf(out, "run %d  %-26s %-8s %8.0f calls/s  p50 %-9v p99 %-9v%s\n", r+1, cell, t.name, res.rate, ms(res.p50), ms(res.p99), errs)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| calls (medians of %d interleaved runs) |", cfg.repeats)
	for _, t := range targets {
		fmt.Fprintf(&b, " %s: calls/s | p99 |", t.name)
	}
	b.WriteString("\n|---|")
	for range targets {
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	for ci, cell := range cells {
		fmt.Fprintf(&b, "| %s |", cell)
		for ti := range targets {
			rs := results[ci][ti]
			if len(rs) == 0 {
				b.WriteString(" — | — |")
				continue
			}
			var rates []float64
			var p99s []time.Duration
			errs := 0
			for _, r := range rs {
				rates, p99s, errs = append(rates, r.rate), append(p99s, r.p99), errs+r.errs
			}
			note := ""
			if errs > 0 {
				note = fmt.Sprintf(" (%d errors)", errs)
			}
			fmt.Fprintf(&b, " %.0f%s | %v |", median(rates), note, ms(median(p99s)))
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

func median[T float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ms renders a latency in milliseconds, two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
