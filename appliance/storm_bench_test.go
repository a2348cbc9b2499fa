package appliance

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// The storm benchmarks drive the real appliance in-process (bbolt, TLS
// gRPC with the per-boot tokens, the boot HTTP handler, inventory and its
// timeline, the lifecycle's agent edge, the node pool) through what one
// machine of a power-on storm does, and count the store writes it costs
// by key prefix (from a watch on the whole store). They print figures and
// assert nothing; bench/README.md ("Storm") says how to run them.
//
// What a machine does here: three DHCP exchanges' worth of inventory work
// (boot/dhcp's EnsureMachineForMAC and BootIntent, and its discover,
// offer and ack timeline entries; the leases themselves are boot/dhcp's
// and not written here), the iPXE script through boot/http's handler
// (its token), kernel and initrd fetches (their timeline entries),
// Register with large facts, and an agent Session with heartbeats. A
// node does ApplyNode.

// stormMAC is machine n's boot MAC.
func stormMAC(n int) string {
	return fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", n>>24&0xff, n>>16&0xff, n>>8&0xff, n&0xff)
}

// stormFacts is a large machine's report: 2 sockets, 24 DIMMs, 12 disks,
// 4 NICs (the first is the boot MAC).
func stormFacts(n int) *inventoryv1.Facts {
	f := &inventoryv1.Facts{
		System:    &inventoryv1.Facts_System{Vendor: "Supermicro", Product: "SYS-2029U-TR4", Serial: fmt.Sprintf("S%09d", n), Uuid: fmt.Sprintf("8c3f5b7e-0000-4000-8000-%012x", n)},
		Baseboard: &inventoryv1.Facts_Board{Vendor: "Supermicro", Product: "X11DPU", Serial: fmt.Sprintf("BB%09d", n)},
		Cpu:       &inventoryv1.Facts_Cpu{Model: "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", Sockets: 2, Cores: 40, Threads: 80},
		Memory:    &inventoryv1.Facts_Memory{TotalBytes: 24 * 32 << 30},
	}
	for d := range 24 {
		f.Memory.Dimms = append(f.Memory.Dimms, &inventoryv1.Facts_Dimm{Locator: fmt.Sprintf("P%d-DIMM%c%d", d/12+1, 'A'+d%6, d%2+1),
			SizeBytes: 32 << 30, Serial: fmt.Sprintf("DIMM%06d%02d", n%1000000, d)})
	}
	for d := range 12 {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{Name: fmt.Sprintf("sd%c", 'a'+d), SizeBytes: 3840 << 30,
			Serial: fmt.Sprintf("S4NDNX0R%06d%02d", n%1000000, d)})
	}
	for i := range 4 {
		mac := stormMAC(n)
		if i > 0 {
			mac = fmt.Sprintf("0c:c4:7a:%02x:%02x:%02x", (n>>12)&0xff, (n>>4)&0xff, (n&0xf)<<4|i)
		}
		f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{Name: fmt.Sprintf("eno%d", i+1), Mac: mac, Driver: "ixgbe", Link: i == 0})
	}
	return f
}

// writeCounter counts committed writes by key prefix through a watch of
// the whole store.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]int
	lost   atomic.Bool // the watch was dropped: the counts are low
}

func countWrites(ctx context.Context, tb testing.TB, st store.Store) *writeCounter {
	tb.Helper()
	ch, err := st.Watch(ctx, "/")
	if err != nil {
		tb.Fatal(err)
	}
	wc := &writeCounter{counts: map[string]int{}}
	go func() {
		for ev := range ch {
			wc.mu.Lock()
			wc.counts[writeClass(ev.KV.Key)]++
			wc.mu.Unlock()
		}
		if ctx.Err() == nil {
			wc.lost.Store(true)
		}
	}()
	return wc
}

// writeClass is a key's prefix up to its record name: two path elements
// ("/inventory/machines"), the timeline's MAC part dropped.
func writeClass(key string) string {
	parts := strings.SplitN(strings.TrimPrefix(key, "/"), "/", 3)
	if len(parts) < 3 {
		return "/" + parts[0] // "/audit/<id>"
	}
	return "/" + parts[0] + "/" + parts[1]
}

func (wc *writeCounter) snapshot() map[string]int {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	out := make(map[string]int, len(wc.counts))
	for k, v := range wc.counts {
		out[k] = v
	}
	return out
}

// diff prints after-before per class, divided by per, and returns the total.
func printWrites(tb testing.TB, what string, before, after map[string]int, per int) float64 {
	var keys []string
	for k := range after {
		if after[k] != before[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	total := 0
	var parts []string
	for _, k := range keys {
		d := after[k] - before[k]
		total += d
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(d)/float64(per)))
	}
	fmt.Printf("STORM writes per %s: %.2f (%s)\n", what, float64(total)/float64(per), strings.Join(parts, ", "))
	return float64(total) / float64(per)
}

// stormEnv is a running appliance plus a boot HTTP handler on its inventory
// and tokens.
type stormEnv struct {
	srv  *Server
	http *boothttp.Server
	conf string // admin.conf
	addr string // API address
}

func startStorm(tb testing.TB) *stormEnv {
	tb.Helper()
	dir := tb.TempDir()
	cfg := Config{DataDir: dir, APIListen: "127.0.0.1:0"}
	// Every simulated machine and node dials from 127.0.0.1.
	cfg.Limits.GRPC.MaxConns, cfg.Limits.GRPC.MaxConnsPerIP = 20000, 20000
	srv, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	cc, err := loadAdmin(tb, dir)
	if err != nil {
		tb.Fatal(err)
	}
	src := tb.TempDir()
	for _, n := range []string{images.UndionlyKPXE, "ipxe.lkrn"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte("bin "+n), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "initrd"), []byte("initramfs"), 0o644); err != nil {
		tb.Fatal(err)
	}
	cat, err := images.Open(images.Config{Dir: tb.TempDir(), IPXEDirs: []string{src}, Initrd: filepath.Join(src, "initrd")})
	if err != nil {
		tb.Fatal(err)
	}
	hs, err := boothttp.New(boothttp.Config{Listen: "127.0.0.1:0", Catalog: cat, Inventory: srv.inv, Tokens: srv.tokens, Timeline: srv.inv,
		APIEndpoint: cc.Endpoint, CAFingerprint: strings.Repeat("ab", 32),
		Scripts: boothttp.ScriptLimits{MaxTracked: 1 << 17}})
	if err != nil {
		tb.Fatal(err)
	}
	hs.Close() // ServeHTTP only: every machine gets its own source address
	return &stormEnv{srv: srv, http: hs, conf: filepath.Join(dir, AdminConfigFile), addr: cc.Endpoint}
}

// get serves one boot HTTP request for mac from its own address.
func (e *stormEnv) get(n int, path string) (*httptest.ResponseRecorder, error) {
	r := httptest.NewRequest(http.MethodGet, "http://10.0.0.1:8080"+path, nil)
	r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:40000", n>>16&0xff, n>>8&0xff, n&0xff)
	w := httptest.NewRecorder()
	e.http.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return w, fmt.Errorf("%s: %d %s", path, w.Code, w.Body)
	}
	return w, nil
}

// boot is machine n's discovery boot up to an open agent session with
// beats heartbeats; it returns the per-phase durations.
type phaseTimes struct{ dhcp, script, artifacts, register, session time.Duration }

func (e *stormEnv) boot(ctx context.Context, tb testing.TB, n, beats int) (phaseTimes, error) {
	var pt phaseTimes
	mac := stormMAC(n)
	inv := e.srv.inv
	t0 := time.Now()
	// Three DORAs (firmware, iPXE, the agent): boot/dhcp's inventory work.
	for range 3 {
		if _, _, err := inv.EnsureMachineForMAC(ctx, mac); err != nil {
			return pt, err
		}
		if _, _, err := inv.BootIntent(ctx, mac); err != nil {
			return pt, err
		}
		for _, ev := range []string{"discover", "offer", "ack"} {
			inv.Event(mac, "dhcp", ev, strings.ToUpper(ev)+" storm", map[string]string{"xid": strconv.Itoa(n)})
		}
	}
	t1 := time.Now()
	pt.dhcp = t1.Sub(t0)
	w, err := e.get(n, "/boot.ipxe?mac="+mac)
	if err != nil {
		return pt, err
	}
	t2 := time.Now()
	pt.script = t2.Sub(t1)
	token := ""
	for _, f := range strings.Fields(w.Body.String()) {
		if v, ok := strings.CutPrefix(f, "corral.token="); ok {
			token = v
		}
	}
	if token == "" {
		return pt, fmt.Errorf("no token in the script of %s", mac)
	}
	for _, a := range []string{images.DiscoverKernel, images.DiscoverInitrd} {
		if _, err := e.get(n, "/images/"+a+"?mac="+mac); err != nil {
			return pt, err
		}
	}
	t3 := time.Now()
	pt.artifacts = t3.Sub(t2)
	cc, err := loadAdmin(tb, filepath.Dir(e.conf))
	if err != nil {
		return pt, err
	}
	c := *cc
	c.Token = token
	conn, err := clientconfig.Dial(&c)
	if err != nil {
		return pt, err
	}
	defer conn.Close()
	ac := nodev1.NewAgentServiceClient(conn)
	resp, err := ac.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: stormFacts(n)})
	if err != nil {
		return pt, fmt.Errorf("register %s: %w", mac, err)
	}
	t4 := time.Now()
	pt.register = t4.Sub(t3)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := ac.Session(sctx)
	if err != nil {
		return pt, err
	}
	hb := &nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: resp.GetSessionId()}}}
	if err := stream.Send(hb); err != nil {
		return pt, err
	}
	if m, err := stream.Recv(); err != nil || m.GetWait() == nil {
		return pt, fmt.Errorf("session %s: first answer %v, %v", mac, m, err)
	}
	pt.session = time.Since(t4)
	for range beats {
		if err := stream.Send(hb); err != nil {
			return pt, err
		}
	}
	stream.CloseSend()
	return pt, nil
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pctl(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkStormWrites counts the store writes of one machine's discovery
// boot (STORM_MACHINES machines, default 200, 8 at a time) and of one node
// heartbeat, by key prefix.
func BenchmarkStormWrites(b *testing.B) {
	e := startStorm(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wc := countWrites(ctx, b, e.srv.store)
	n := envInt("STORM_MACHINES", 200)
	before := wc.snapshot()
	cpu0, t0 := cpuTime(), time.Now()
	var g sync.WaitGroup
	sem := make(chan struct{}, 8)
	var failed atomic.Int64
	for i := range n {
		g.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; g.Done() }()
			if _, err := e.boot(ctx, b, i, 2); err != nil {
				failed.Add(1)
				b.Log(err)
			}
		}()
	}
	g.Wait()
	if err := e.srv.inv.FlushTimeline(ctx); err != nil {
		b.Fatal(err)
	}
	cpu, el := cpuTime()-cpu0, time.Since(t0)
	time.Sleep(200 * time.Millisecond) // session ends
	printWrites(b, "machine (discovery boot)", before, wc.snapshot(), n)
	fmt.Printf("STORM CPU per machine (discovery boot, client side included): %.2f ms; %d machines in %.1f s\n",
		float64(cpu.Microseconds())/1e3/float64(n), n, el.Seconds())

	nodes := envInt("STORM_NODES", 200)
	ncs := e.nodeClients(b, nodes, 8)
	for i, c := range ncs {
		e.beat(ctx, b, c, i)
	}
	before = wc.snapshot()
	for i, c := range ncs {
		e.beat(ctx, b, c, i)
	}
	time.Sleep(100 * time.Millisecond)
	printWrites(b, "node heartbeat (ApplyNode, node certificate)", before, wc.snapshot(), nodes)
	if wc.lost.Load() {
		fmt.Println("STORM the write-counting watch fell behind: counts are low")
	}
	fmt.Printf("STORM failed machines: %d\n", failed.Load())
	runtime.KeepAlive(e)
}

// nodeClients signs a certificate for node-00000 … and returns one
// NodeService client per node, on conns connections shared round-robin
// (each its own TLS session; a real node holds one of its own).
func (e *stormEnv) nodeClients(tb testing.TB, n, conns int) []poolv1.NodeServiceClient {
	tb.Helper()
	cc, _ := loadAdmin(tb, filepath.Dir(e.conf))
	out := make([]poolv1.NodeServiceClient, n)
	for i := range n {
		name := stormNode(i)
		k := newNodeKey(tb, nil)
		certPEM, err := e.srv.signNodeCert(context.Background(), name, []byte(k.csr), "install")
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = poolv1.NewNodeServiceClient(dialCert(tb, cc, k.pair(tb, string(certPEM))))
	}
	return out
}

func stormNode(i int) string { return fmt.Sprintf("node-%05d", i) }

// beat is node i's heartbeat: ApplyNode with its unchanged spec.
func (e *stormEnv) beat(ctx context.Context, tb testing.TB, c poolv1.NodeServiceClient, i int) {
	if _, err := c.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: stormNode(i), CpuMilliCores: 80_000, MemoryBytes: 768 << 30,
		StorageBytes: 12 * 3840 << 30, Rack: fmt.Sprintf("r%02d", i/40), Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), HypervisorPort: 20181,
		Labels: map[string]string{"corral/serial": fmt.Sprintf("S%09d", i)}}); err != nil {
		tb.Fatalf("ApplyNode %s: %v", stormNode(i), err)
	}
}

// BenchmarkStormNodeBeats prints the CPU and latency of node heartbeats
// (ApplyNode over mTLS with the revocation check, STORM_NODES nodes,
// default 500, each its own connection, 64 in flight) against GetNode on
// the same connections (the same call path without the store write).
func BenchmarkStormNodeBeats(b *testing.B) {
	e := startStorm(b)
	ctx := context.Background()
	nodes := envInt("STORM_NODES", 500)
	ncs := e.nodeClients(b, nodes, nodes)
	for i, c := range ncs {
		e.beat(ctx, b, c, i)
	}
	rounds := envInt("STORM_ROUNDS", 4)
	ops := []string{"ApplyNode", "GetNode", "ApplyNode", "GetNode"}
	if v := os.Getenv("STORM_OPS"); v != "" {
		ops = strings.Split(v, ",")
	}
	for _, op := range ops {
		var lat []time.Duration
		var mu sync.Mutex
		sem := make(chan struct{}, 64)
		var g sync.WaitGroup
		cpu0, t0 := cpuTime(), time.Now()
		for r := range rounds * nodes {
			i := r % nodes
			g.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; g.Done() }()
				s := time.Now()
				if op == "ApplyNode" {
					e.beat(ctx, b, ncs[i], i)
				} else if _, err := ncs[i].GetNode(ctx, &poolv1.GetNodeRequest{Name: stormNode(i)}); err != nil {
					b.Error(err)
				}
				d := time.Since(s)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}()
		}
		g.Wait()
		el, cpu := time.Since(t0), cpuTime()-cpu0
		calls := rounds * nodes
		fmt.Printf("STORM %-9s %d nodes: %6.0f calls/s, %5.0f µs CPU per call (client and server in one process), p50 %v p99 %v\n",
			op, nodes, float64(calls)/el.Seconds(), float64(cpu.Microseconds())/float64(calls), pctl(lat, .5).Round(time.Microsecond), pctl(lat, .99).Round(time.Microsecond))
	}
}

// BenchmarkStorm is the storm itself, in-process: STORM_MACHINES machines
// (default 1,000) power on at STORM_RATE a second (default 83, i.e.
// 5,000 in 60 s) and each does its discovery boot (stormEnv.boot) while
// STORM_NODES nodes (default 1,000) beat every 10 s, spread evenly. It
// prints per-phase p50/p99, the time until every machine is INVENTORIED,
// failures, CPU (simulated clients included: they share the process),
// heap, the store file's size and the node beats' p50/p99.
func BenchmarkStorm(b *testing.B) {
	e := startStorm(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	machines, rate, nodes := envInt("STORM_MACHINES", 1000), envInt("STORM_RATE", 83), envInt("STORM_NODES", 1000)
	ncs := e.nodeClients(b, nodes, nodes)
	for i, c := range ncs {
		e.beat(ctx, b, c, i)
	}
	var beatMu sync.Mutex
	var beatLat []time.Duration
	var beatErr atomic.Int64
	beatCtx, stopBeats := context.WithCancel(ctx)
	var beaters sync.WaitGroup
	for i, c := range ncs {
		beaters.Add(1)
		go func() {
			defer beaters.Done()
			t := time.NewTimer(time.Duration(i) * 10 * time.Second / time.Duration(nodes))
			for {
				select {
				case <-beatCtx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				t.Reset(10 * time.Second)
				s := time.Now()
				_, err := c.ApplyNode(beatCtx, &poolv1.ApplyNodeRequest{Name: stormNode(i), CpuMilliCores: 80_000, MemoryBytes: 768 << 30,
					StorageBytes: 12 * 3840 << 30, Rack: fmt.Sprintf("r%02d", i/40), Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), HypervisorPort: 20181,
					Labels: map[string]string{"corral/serial": fmt.Sprintf("S%09d", i)}})
				if err != nil {
					if beatCtx.Err() == nil {
						beatErr.Add(1)
					}
					continue
				}
				d := time.Since(s)
				beatMu.Lock()
				beatLat = append(beatLat, d)
				beatMu.Unlock()
			}
		}()
	}
	// NOT_READY flaps: every node record written NOT_READY during the storm.
	var flaps atomic.Int64
	nodeEvents, err := e.srv.store.Watch(ctx, "/pool/nodes/")
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for ev := range nodeEvents {
			var n poolv1.Node
			if ev.Type == store.EventPut && record.Unmarshal(ev.KV.Value, &n) == nil && n.GetState() == poolv1.Node_NOT_READY {
				flaps.Add(1)
			}
		}
	}()
	var mu sync.Mutex
	var phases [5][]time.Duration
	var failed atomic.Int64
	var g sync.WaitGroup
	sem := make(chan struct{}, 1024)
	cpu0, t0 := cpuTime(), time.Now()
	for i := range machines {
		if d := time.Until(t0.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		g.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; g.Done() }()
			pt, err := e.boot(ctx, b, 1_000_000+i, 1)
			if err != nil {
				failed.Add(1)
				b.Log(err)
				return
			}
			mu.Lock()
			for k, d := range []time.Duration{pt.dhcp, pt.script, pt.artifacts, pt.register, pt.session} {
				phases[k] = append(phases[k], d)
			}
			mu.Unlock()
		}()
	}
	if path := os.Getenv("STORM_GOROUTINES"); path != "" {
		// Where everything waits, as the arrivals end.
		if f, err := os.Create(path); err == nil {
			pprof.Lookup("goroutine").WriteTo(f, 1)
			f.Close()
		}
	}
	g.Wait()
	all := time.Since(t0)
	cpu := cpuTime() - cpu0
	stopBeats()
	beaters.Wait()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fi, _ := os.Stat(filepath.Join(filepath.Dir(e.conf), StoreFile))
	var size int64
	if fi != nil {
		size = fi.Size()
	}
	fmt.Printf("STORM %d machines at %d/s with %d nodes beating every 10 s: all registered after %.1f s (arrivals end at %.1f s), %d failed\n",
		machines, rate, nodes, all.Seconds(), float64(machines)/float64(rate), failed.Load())
	for k, name := range []string{"dhcp inventory (3 DORAs)", "iPXE script", "kernel+initrd (timeline)", "Register", "Session open"} {
		fmt.Printf("STORM   %-26s p50 %8v  p99 %8v\n", name, pctl(phases[k], .5).Round(time.Microsecond), pctl(phases[k], .99).Round(time.Microsecond))
	}
	fmt.Printf("STORM   node beats: %d, p50 %v p99 %v, %d failed, %d NOT_READY flaps\n", len(beatLat), pctl(beatLat, .5).Round(time.Microsecond), pctl(beatLat, .99).Round(time.Microsecond), beatErr.Load(), flaps.Load())
	fmt.Printf("STORM   CPU %.1f s over %.1f s (%.0f%% of the 2 cores; simulated clients included), heap in use %d MB, store file %d MB\n",
		cpu.Seconds(), all.Seconds(), 100*cpu.Seconds()/all.Seconds()/float64(runtime.NumCPU()), ms.HeapInuse>>20, size>>20)
}

// rssBytes is this process's resident set (VmRSS).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkStormFootprint writes STORM_MACHINES machines (default 5,000)
// with large facts through the real inventory code (placeholder, Register,
// 13 timeline entries each as in BenchmarkStormWrites) and STORM_NODES
// nodes (default 5,000) into a fresh bbolt store, and prints the store
// file's size and the heap and RSS growth per machine.
func BenchmarkStormFootprint(b *testing.B) {
	dir := b.TempDir()
	st, err := OpenStore(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	inv, err := inventory.New(inventory.Config{Store: st, MaxDiscovered: -1})
	if err != nil {
		b.Fatal(err)
	}
	p, err := pool.New(pool.Config{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	machines, nodes := envInt("STORM_MACHINES", 5000), envInt("STORM_NODES", 5000)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	rss0 := rssBytes()
	var g sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range machines {
		g.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; g.Done() }()
			mac := stormMAC(i)
			if _, _, err := inv.EnsureMachineForMAC(ctx, mac); err != nil {
				b.Error(err)
				return
			}
			for _, ev := range []string{"discover", "offer", "ack", "discover", "offer", "ack", "discover", "offer", "ack", "script", "artifact", "artifact"} {
				inv.Event(mac, "dhcp", ev, strings.ToUpper(ev)+" storm footprint, a detail of typical length for a boot event", map[string]string{"xid": strconv.Itoa(i), "peer": "10.0.0.1"})
			}
			if _, err := inv.Register(ctx, mac, stormFacts(i), inventory.RegisterOptions{}); err != nil {
				b.Error(err)
			}
		}()
	}
	for i := range nodes {
		g.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; g.Done() }()
			if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: stormNode(i), CpuMilliCores: 80_000, MemoryBytes: 768 << 30,
				StorageBytes: 12 * 3840 << 30, Rack: fmt.Sprintf("r%02d", i/40), Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), HypervisorPort: 20181,
				Labels: map[string]string{"corral/serial": fmt.Sprintf("S%09d", i)}}); err != nil {
				b.Error(err)
			}
		}()
	}
	g.Wait()
	if err := inv.FlushTimeline(ctx); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	rss1 := rssBytes()
	fi, err := os.Stat(filepath.Join(dir, StoreFile))
	if err != nil {
		b.Fatal(err)
	}
	var mrec int
	if kvs, err := st.List(ctx, "/inventory/machines/"); err == nil {
		for _, kv := range kvs {
			mrec += len(kv.Value)
		}
		mrec /= max(1, len(kvs))
	}
	fmt.Printf("STORM footprint: %d machines (large facts, 13 timeline entries each) + %d nodes: store file %.1f MB (%.1f KB per machine+node), machine record %.1f KB; heap in use +%.1f MB (%.1f KB per machine), RSS +%.1f MB (%.1f KB per machine)\n",
		machines, nodes, float64(fi.Size())/1e6, float64(fi.Size())/1e3/float64(machines), float64(mrec)/1e3,
		float64(int64(ms1.HeapInuse)-int64(ms0.HeapInuse))/1e6, float64(int64(ms1.HeapInuse)-int64(ms0.HeapInuse))/1e3/float64(machines),
		float64(rss1-rss0)/1e6, float64(rss1-rss0)/1e3/float64(machines))
}
