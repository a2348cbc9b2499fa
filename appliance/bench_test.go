package appliance

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// benchRoundTrips runs b.N round trips split across clients goroutines and
// reports round trips per second and p50/p99 latency. Figures are printed,
// never asserted.
func benchRoundTrips(b *testing.B, clients int, op func(client, i int) error) {
	b.Helper()
	lat := make([][]time.Duration, clients)
	per := (b.N + clients - 1) / clients
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				t0 := time.Now()
				if err := op(c, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(float64(len(all))*p))] }
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "roundtrips/s")
	b.ReportMetric(float64(pct(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(pct(0.99).Microseconds()), "p99-µs")
}

// BenchmarkReserveReleaseCompute: ReserveCompute + ReleaseCompute through
// the real TLS gRPC server (auth included) on bbolt.
func BenchmarkReserveReleaseCompute(b *testing.B) {
	for _, clients := range []int{1, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			_, cc := startServer(b, b.TempDir())
			conn := dial(b, cc, "")
			c := poolv1.NewNodeServiceClient(conn)
			applyNode(b, c, "n1", 1_000_000, 1<<40)
			ctx := context.Background()
			benchRoundTrips(b, clients, func(client, i int) error {
				name := fmt.Sprintf("c%d-%d", client, i)
				if _, err := c.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: "n1", ComputeName: name,
					RequestCpuMilliCore: 100, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 20, LimitMemoryBytes: 1 << 20}); err != nil {
					return err
				}
				_, err := c.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: "n1", ComputeName: name})
				return err
			})
		})
	}
}

// BenchmarkReserveReleaseNetworkInterface: ReserveNetworkInterface (auto
// IPv4, generated MAC) + ReleaseNetworkInterface on a /16.
func BenchmarkReserveReleaseNetworkInterface(b *testing.B) {
	for _, clients := range []int{1, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			_, cc := startServer(b, b.TempDir())
			c := poolv1.NewNetworkServiceClient(dial(b, cc, ""))
			ctx := context.Background()
			if _, err := c.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.64.0.0/16", Ipv4Gateway: "10.64.0.1"}); err != nil {
				b.Fatal(err)
			}
			benchRoundTrips(b, clients, func(client, i int) error {
				name := fmt.Sprintf("if%d-%d", client, i)
				if _, err := c.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: name}); err != nil {
					return err
				}
				_, err := c.ReleaseNetworkInterface(ctx, &poolv1.ReleaseNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: name})
				return err
			})
		})
	}
}
