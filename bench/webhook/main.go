// Command webhook measures webhook delivery latency: it writes machine
// state changes into a bbolt store at a fixed rate, runs the appliance's
// webhook dispatcher on it, and times each change from just before its
// store write to its arrival at each of N local HTTPS receivers. It prints
// p50/p99/max and what was lost; it asserts nothing (bench/README.md).
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/appliance/webhook"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "webhook bench:", err)
		os.Exit(1)
	}
}

type sink struct {
	mu   sync.Mutex
	lat  []time.Duration
	seen map[string]bool
	dups int
}

func run() error {
	rate := flag.Int("rate", 1000, "state changes per second")
	receivers := flag.Int("receivers", 10, "HTTPS receivers, each subscribed to machine.state")
	duration := flag.Duration("duration", 10*time.Second, "how long to write changes")
	machines := flag.Int("machines", 100, "machines the changes are spread over")
	flag.Parse()

	dir, err := os.MkdirTemp("", "webhook-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := bolt.Open(filepath.Join(dir, "corral.db"), bolt.Options{CommitWindow: bolt.DefaultCommitWindow})
	if err != nil {
		return err
	}
	defer st.Close()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	sealer, err := seal.New(key)
	if err != nil {
		return err
	}
	svc := webhook.NewService(st, sealer, webhook.Guard{}, nil)
	d, err := webhook.NewDispatcher(webhook.Config{Store: st, Service: svc, Registerer: prometheus.NewRegistry(), QueueSize: 1 << 16})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	sinks := make([]*sink, *receivers)
	for i := range sinks {
		s := &sink{seen: map[string]bool{}}
		sinks[i] = s
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			now := time.Now()
			var ev struct {
				ID   string
				Data struct{ Reason string }
			}
			if json.Unmarshal(body, &ev) == nil {
				if ns, err := strconv.ParseInt(strings.TrimPrefix(ev.Data.Reason, "t="), 10, 64); err == nil {
					s.mu.Lock()
					if s.seen[ev.ID] {
						s.dups++
					} else {
						s.seen[ev.ID] = true
						s.lat = append(s.lat, now.Sub(time.Unix(0, ns)))
					}
					s.mu.Unlock()
				}
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		defer srv.Close()
		ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
		if _, _, err := svc.Add(ctx, &webhookv1.AddWebhookRequest{Name: fmt.Sprintf("r%02d", i), Url: srv.URL,
			Events: []string{webhook.ClassMachineState}, AllowBootLan: true, CaPem: ca}); err != nil {
			return err
		}
	}
	time.Sleep(500 * time.Millisecond) // the dispatcher picks the receivers up

	states := []inventoryv1.Machine_MachineState{inventoryv1.Machine_READY, inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYING, inventoryv1.Machine_DEPLOYED}
	total := *rate * int(duration.Seconds())
	// Writers: enough of them that the store's flush does not cap the rate.
	const writers = 64
	tick := time.Second / time.Duration(*rate)
	start := time.Now()
	var wg sync.WaitGroup
	var werr error
	var emu sync.Mutex
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += writers {
				if at := start.Add(time.Duration(i) * tick); time.Until(at) > 0 {
					time.Sleep(time.Until(at))
				}
				name := fmt.Sprintf("m%03d", i%*machines)
				seq := i / *machines
				m := &inventoryv1.Machine{Name: name, State: states[seq%len(states)], StateReason: "t=" + strconv.FormatInt(time.Now().UnixNano(), 10)}
				_, err := record.Mutate(ctx, st, store.MachinesPrefix+name, func() *inventoryv1.Machine { return &inventoryv1.Machine{} },
					func(cur *inventoryv1.Machine, _ bool) (bool, error) {
						cur.Name, cur.StateReason = m.Name, m.StateReason
						// Each write moves the machine to the state after its current one.
						cur.State = states[(slices.Index(states, cur.GetState())+1)%len(states)]
						return false, nil
					})
				if err != nil {
					emu.Lock()
					werr = err
					emu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if werr != nil {
		return werr
	}
	wrote := time.Since(start)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		for _, s := range sinks {
			s.mu.Lock()
			n += len(s.lat)
			s.mu.Unlock()
		}
		if n >= total**receivers {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var all []time.Duration
	dups := 0
	for _, s := range sinks {
		s.mu.Lock()
		all = append(all, s.lat...)
		dups += s.dups
		s.mu.Unlock()
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(float64(len(all))*p))]
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average: %s", b)
	}
	fmt.Printf("changes written: %d in %v (%.0f/s), receivers: %d\n", total, wrote.Round(time.Millisecond), float64(total)/wrote.Seconds(), *receivers)
	fmt.Printf("deliveries: %d of %d expected, duplicates %d\n", len(all), total**receivers, dups)
	fmt.Printf("latency write->receipt: p50 %v p99 %v max %v\n", pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), pct(1).Round(time.Microsecond))
	cancel()
	return <-done
}
