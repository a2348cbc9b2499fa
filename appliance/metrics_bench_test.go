package appliance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// BenchmarkMetricsScrape is /metrics with 5,000 machines in the appliance's
// bbolt store (facts of a QEMU machine each, states spread over the
// lifecycle): it prints the p50/p99 of 20 scrapes and the body size, and
// for comparison what computing the machine counts at scrape time (a List
// and a decode of every machine) would cost. Figures are printed, never
// asserted (bench/README.md).
//
//	go test -run '^$' -bench BenchmarkMetricsScrape -benchtime 1x ./appliance/
func BenchmarkMetricsScrape(b *testing.B) {
	const machines, scrapes = 5000, 20
	dir := b.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Metrics: MetricsConfig{Listen: "127.0.0.1:0"}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	states := []inventoryv1.Machine_MachineState{inventoryv1.Machine_DISCOVERED, inventoryv1.Machine_INVENTORIED,
		inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED, inventoryv1.Machine_FAILED, inventoryv1.Machine_MAINTENANCE}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // bbolt group-commits concurrent writes
	start := time.Now()
	for i := range machines {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(i>>16), byte(i>>8), byte(i))
			serial := fmt.Sprintf("SN%06d", i)
			m := &inventoryv1.Machine{Name: fmt.Sprintf("m-%06d", i), Macs: []string{mac}, BootMac: mac, Serial: serial,
				State: states[i%len(states)], Facts: machinefacts.QEMU(serial, fmt.Sprintf("uuid-%06d", i), mac)}
			if _, err := record.Put(ctx, srv.store, fleet.MachinePrefix+m.GetName(), m, 0); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.Logf("%d machines written in %s", machines, time.Since(start).Round(time.Millisecond))

	// The counts follow the store through its watch.
	url := "http://" + srv.MetricsAddr().String() + "/metrics"
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		total := scrapedMachines(b, url)
		if total == machines {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("counts reached %d of %d machines", total, machines)
		}
	}

	var lat []time.Duration
	size := 0
	b.ResetTimer()
	for range b.N {
		lat = lat[:0]
		for range scrapes {
			t0 := time.Now()
			r, err := http.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil || r.StatusCode != http.StatusOK {
				b.Fatalf("scrape: %d %v", r.StatusCode, err)
			}
			lat = append(lat, time.Since(t0))
			size = len(body)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(size), "body_bytes")

	// The alternative: count at scrape time with a List of every machine.
	var listLat []time.Duration
	for range 5 {
		t0 := time.Now()
		kvs, err := srv.store.List(ctx, fleet.MachinePrefix)
		if err != nil {
			b.Fatal(err)
		}
		n := map[inventoryv1.Machine_MachineState]int{}
		for _, kv := range kvs {
			var m inventoryv1.Machine
			if err := record.Unmarshal(kv.Value, &m); err != nil {
				b.Fatal(err)
			}
			n[m.GetState()]++
		}
		listLat = append(listLat, time.Since(t0))
	}
	slices.Sort(listLat)
	b.ReportMetric(float64(listLat[len(listLat)/2].Microseconds())/1000, "list_decode_p50_ms")
	b.Logf("scrape p50 %s p99 %s, body %d bytes; counting by List+decode at scrape instead: p50 %s",
		p50.Round(time.Microsecond), p99.Round(time.Microsecond), size, listLat[len(listLat)/2].Round(time.Microsecond))
}

// scrapedMachines sums the corral_machines gauges of one scrape of url.
func scrapedMachines(b *testing.B, url string) int {
	r, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		b.Fatal(err)
	}
	total := 0
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "corral_machines{") {
			continue
		}
		f := strings.Fields(line)
		n, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			b.Fatalf("%q: %v", line, err)
		}
		total += int(n)
	}
	return total
}
