package fleetsim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// joinNode makes a node key and has the appliance sign its CSR through
// AgentService.Join on the admin connection.
func joinNode(ctx context.Context, admin *grpc.ClientConn, name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, nil, err
	}
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := nodev1.NewAgentServiceClient(admin).Join(jctx, &nodev1.JoinRequest{
		Name: name, CsrPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
	})
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return []byte(resp.GetCertPem()), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// Report is what a storm measured.
type Report struct {
	Machines, Nodes          int
	Appliances               int    // 1 alone; more: a fleet on etcd
	Setup                    string // Config's shape (shares, stagger, heartbeats, sizes)
	Stagger                  time.Duration
	FullFetchShare           float64
	KernelBytes, InitrdBytes int64

	// The appliance's view at the end (ListMachines, ListNodes).
	Inventoried, Lost, NodesReady int
	// Failed machines are FAILED in the appliance's view at the end
	// (counted in Inventoried when they had registered).
	Failed int
	States map[string]int
	// Registered is what the machines saw: successful Registers.
	Registered int
	// Duplicates: an address ACKed to a second MAC while the first held
	// it. The lease cross-check (the appliance's bbolt file after the
	// run): MACs with two live leases, held addresses whose live lease
	// names another MAC, held addresses without a live lease.
	Duplicates                                  int
	DupLines                                    []string
	LeasesLive                                  int
	LeaseMACsTwice, LeaseMismatch, LeaseMissing int
	Flaps                                       int
	// MaxNotReady is the most nodes corrald's gauge counted NOT_READY at
	// once (sampled every second).
	MaxNotReady                               int
	FlapLines                                 []string
	Seconds, WallSeconds, AllInventoriedAfter float64
	// AllRegisteredAfter: the last machine's first Register answered OK
	// (the appliance has stored it INVENTORIED when it answers).
	AllRegisteredAfter                       float64
	CPUSeconds                               float64
	StartRSSBytes, PeakRSSBytes, EndRSSBytes int64
	StoreBytes                               int64
	Threads                                  int
	// The soak: nodes heartbeating, nothing booting. SoakCPUSeconds is
	// corrald's CPU over SoakSeconds, for SoakHeartbeats ApplyNode calls.
	SoakSeconds, SoakCPUSeconds float64
	SoakHeartbeats              int64
	// RunQueueSeconds is how long corrald's threads were runnable but
	// waiting for a CPU; SimCPUSeconds the simulator's own CPU (it shares
	// the machine).
	RunQueueSeconds, SimCPUSeconds float64
	Phases                         []PhaseFigures
	Failures                       map[string]int
	Counters                       map[string]int64
	// Queues are corrald's own histograms at the end of the storm (API
	// handling by method, store commits, boot HTTP, boot phases);
	// MetricCounters its DHCP and boot HTTP outcomes.
	Queues         []QueueLine
	MetricCounters map[string]float64
	// Profile is corrald's hottest functions (Config.ProfileSeconds).
	Profile     []string
	ProfileNote string
	Load        string
	Notes       []string
	// A fleet's appliances and etcd members (empty for one appliance);
	// the figures above are then the sums over the appliances.
	Fleet []ApplianceFigures
	Etcd  []EtcdFigures
	// EtcdRevision is the cluster's revision at the end (every write
	// since it started); EtcdKeys the live keys by prefix and
	// EtcdVersions their puts.
	EtcdRevision int64
	EtcdKeys     map[string]int
	EtcdVersions map[string]int64
}

// Setup is the storm's shape beside N and M (shares, stagger, heartbeats,
// artifact sizes): figures compare only between equal setups.
func (c *Config) setup() string {
	if c.Appliances > 1 {
		dhcp := "all"
		if c.FirstDHCPOnly {
			dhcp = "first"
		}
		return fmt.Sprintf("appliances=%d (etcd, dhcp on %s) ", c.Appliances, dhcp) + c.setupOne()
	}
	return c.setupOne()
}

func (c *Config) setupOne() string {
	return fmt.Sprintf("tftp=%t boot-retry=%s stagger=%s relay=%.2f uefi=%.2f large=%.2f kexec=%.2f full-fetch=%.2f artifacts=%d+%d agent-hb=%s node-hb=%s",
		!c.NoTFTP, c.BootRetry, c.Stagger, c.RelayShare, c.UEFIShare, c.LargeShare, c.KexecShare, c.FullFetchShare, c.KernelBytes, c.InitrdBytes, c.AgentHeartbeat, c.NodeHeartbeat)
}

// OK reports the correctness the CI storm asserts: every machine
// inventoried, none lost or FAILED, no duplicate address (seen by the
// clients or in the appliance's leases), no NOT_READY flap.
func (r *Report) OK() bool {
	return r.Inventoried == r.Machines && r.Lost == 0 && r.Failed == 0 && r.Duplicates == 0 && r.LeaseMACsTwice == 0 && r.LeaseMismatch == 0 && r.Flaps == 0
}

// Summary is the last line of the output, for scripts.
func (r *Report) Summary() string {
	return fmt.Sprintf("fleet: %d/%d inventoried, %d lost, %d duplicate addresses, %d NOT_READY flaps, %.0f s",
		r.Inventoried, r.Machines, r.Lost, r.Duplicates+r.LeaseMACsTwice+r.LeaseMismatch, r.Flaps, r.Seconds)
}

// Figures are the report's numbers by name, as the baseline file keeps
// them (smaller is better for all but "inventoried").
func (r *Report) Figures() map[string]float64 {
	f := map[string]float64{
		"seconds":               r.Seconds,
		"all_inventoried_s":     r.AllInventoriedAfter,
		"cpu_s":                 r.CPUSeconds,
		"peak_rss_mib":          float64(r.PeakRSSBytes) / (1 << 20),
		"end_rss_mib":           float64(r.EndRSSBytes) / (1 << 20),
		"store_mib":             float64(r.StoreBytes) / (1 << 20),
		"rss_kib_per_machine":   float64(r.EndRSSBytes-r.StartRSSBytes) / 1024 / float64(r.Machines),
		"store_kib_per_machine": float64(r.StoreBytes) / 1024 / float64(r.Machines),
		"cpu_ms_per_machine":    1000 * r.CPUSeconds / float64(r.Machines),
		"lost":                  float64(r.Lost),
		"failed":                float64(r.Failed),
		"all_registered_s":      r.AllRegisteredAfter,
		"run_queue_wait_s":      r.RunQueueSeconds,
		"soak_cpu_ms_per_beat":  1000 * r.SoakCPUSeconds / max(float64(r.SoakHeartbeats), 1),
		"flaps":                 float64(r.Flaps),
		"dhcp_retries":          float64(r.Counters["dhcp retries"]),
		"failures":              float64(sum(r.Failures)),
	}
	for _, p := range r.Phases {
		k := phaseKey(p.Phase)
		f[k+"_p50_ms"] = ms(p.P50)
		f[k+"_p99_ms"] = ms(p.P99)
	}
	return f
}

func phaseKey(p string) string {
	return strings.NewReplacer(" ", "_", "→", "_to_", "+", "_").Replace(p)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Baseline is the recorded figures of an earlier storm (bench/fleet-baseline.json).
type Baseline struct {
	Machines int                `json:"machines"`
	Nodes    int                `json:"nodes"`
	Setup    string             `json:"setup,omitempty"`
	Recorded string             `json:"recorded"`
	Load     string             `json:"load"`
	Figures  map[string]float64 `json:"figures"`
}

// Baselines are keyed by "MACHINESxNODES" (e.g. "5000x5000").
type Baselines map[string]Baseline

// BaselineKey names r's storm size in a Baselines file.
// A fleet's key adds the appliances: "10000x1000@3".
func (r *Report) BaselineKey() string {
	if r.Appliances > 1 {
		return fmt.Sprintf("%dx%d@%d", r.Machines, r.Nodes, r.Appliances)
	}
	return fmt.Sprintf("%dx%d", r.Machines, r.Nodes)
}

// LoadBaselines reads the baseline file; a missing file is no baselines.
func LoadBaselines(path string) (Baselines, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return Baselines{}, nil
	}
	if err != nil {
		return nil, err
	}
	var bs Baselines
	if err := json.Unmarshal(b, &bs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return bs, nil
}

// Record puts r into bs under its key.
func (bs Baselines) Record(r *Report) {
	bs[r.BaselineKey()] = Baseline{Machines: r.Machines, Nodes: r.Nodes, Setup: r.Setup, Recorded: time.Now().UTC().Format(time.RFC3339), Load: r.Load, Figures: r.Figures()}
}

// Write saves bs as indented JSON.
func (bs Baselines) Write(path string) error {
	b, err := json.MarshalIndent(bs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Print writes the compact table, the failures, the before→now
// comparison against base (nil: none recorded) and, last, the summary.
func (r *Report) Print(w io.Writer, base *Baseline) {
	fetch := "ranged (first 64 KiB of kernel and initramfs, 206 + Content-Range checked)"
	if r.FullFetchShare > 0 {
		fetch = fmt.Sprintf("full for %.0f%% of the machines, ranged for the rest", 100*r.FullFetchShare)
	}
	on := ""
	if r.Appliances > 1 {
		on = fmt.Sprintf(" against %d appliances on a %d-member etcd (corrald figures below are their sums)", r.Appliances, len(r.Etcd))
	}
	fmt.Fprintf(w, "fleet storm: %d machines powered on over %s, %d nodes%s; fetches %s; load %s\n", r.Machines, r.Stagger, r.Nodes, on, fetch, r.Load)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tn\tp50\tp99\tmax\t")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", p.Phase, p.N, round(p.P50), round(p.P99), round(p.Max))
	}
	tw.Flush()
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "all registered (Register answered) after %.1f s; all INVENTORIED (corrald's corral_machines gauges) after %.1f s; storm %.1f s; at the end (ListMachines, ListNodes) states %v, nodes READY %d/%d; most nodes NOT_READY at once %d\n",
		r.AllRegisteredAfter, r.AllInventoriedAfter, r.Seconds, r.States, r.NodesReady, r.Nodes, r.MaxNotReady)
	fmt.Fprintf(w, "corrald: cpu %.1f s over %.0f s (%.0f%% of a core, %.1f ms a machine), rss start %.0f MiB peak %.0f MiB end %.0f MiB (%.1f KiB a machine), threads %d\n",
		r.CPUSeconds, r.WallSeconds, 100*r.CPUSeconds/max(r.WallSeconds, 1), 1000*r.CPUSeconds/float64(r.Machines),
		mib(r.StartRSSBytes), mib(r.PeakRSSBytes), mib(r.EndRSSBytes), float64(r.EndRSSBytes-r.StartRSSBytes)/1024/float64(r.Machines), r.Threads)
	if r.SoakHeartbeats > 0 {
		fmt.Fprintf(w, "steady state (soak, %d nodes heartbeating, nothing booting): corrald cpu %.1f s over %.0f s = %.0f%% of a core, %.2f ms per heartbeat (%d heartbeats, %.0f/s)\n",
			r.NodesReady, r.SoakCPUSeconds, r.SoakSeconds, 100*r.SoakCPUSeconds/max(r.SoakSeconds, 1), 1000*r.SoakCPUSeconds/float64(r.SoakHeartbeats),
			r.SoakHeartbeats, float64(r.SoakHeartbeats)/max(r.SoakSeconds, 1))
	}
	fmt.Fprintf(w, "corrald threads waited %.1f s for a CPU (runnable, not running); the simulator used %.1f s of CPU\n", r.RunQueueSeconds, r.SimCPUSeconds)
	fmt.Fprintf(w, "store: corral.db (+ journal) %.1f MiB (%.1f KiB a machine); leases live %d, MACs with two live leases %d, held addresses leased to another MAC %d, held without a live lease %d\n",
		mib(r.StoreBytes), float64(r.StoreBytes)/1024/float64(r.Machines), r.LeasesLive, r.LeaseMACsTwice, r.LeaseMismatch, r.LeaseMissing)
	if n := r.Counters["bytes fetched"]; n > 0 {
		full := float64(r.Machines) * float64(r.KernelBytes+r.InitrdBytes)
		fmt.Fprintf(w, "fetched %.1f MiB; a full fetch for every machine would be %.1f GB: %.0f s at 10 Gb/s, %.0f s at 25 Gb/s\n",
			float64(n)/(1<<20), full/1e9, full*8/10e9, full*8/25e9)
	}
	for _, k := range sortedKeys(r.Counters) {
		if k != "bytes fetched" && (r.Counters[k] != 0 || strings.HasPrefix(k, "udp")) {
			fmt.Fprintf(w, "  %s: %d\n", k, r.Counters[k])
		}
	}
	if len(r.Failures) > 0 {
		fmt.Fprintln(w, "failures by cause:")
		for _, k := range sortedKeys(r.Failures) {
			fmt.Fprintf(w, "  %6d  %s\n", r.Failures[k], k)
		}
	}
	if len(r.Queues) > 0 {
		whose := "corrald's"
		if len(r.Fleet) > 0 {
			whose = r.Fleet[0].Name + "'s"
		}
		fmt.Fprintf(w, "where it queues (%s /metrics at the end of the storm; p50/p99 estimated from buckets):\n", whose)
		tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  series\tcount\tmean\tp50\tp99\ttotal\t")
		for _, q := range r.Queues {
			fmt.Fprintf(tw, "  %s\t%.0f\t%s\t%s\t%s\t%s\t\n", shortSeries(q.Series), q.Count, fmtSeconds(q.Mean), fmtSeconds(q.P50), fmtSeconds(q.P99), fmtSeconds(q.Sum))
		}
		tw.Flush()
		for _, k := range sortedKeys(r.MetricCounters) {
			fmt.Fprintf(w, "  %s %.0f\n", shortSeries(k), r.MetricCounters[k])
		}
	}
	r.printFleet(w)
	if r.ProfileNote != "" {
		fmt.Fprintln(w, r.ProfileNote)
		for _, l := range r.Profile {
			fmt.Fprintln(w, "  "+l)
		}
	}
	for _, l := range r.DupLines {
		fmt.Fprintln(w, "duplicate:", l)
	}
	for _, l := range r.FlapLines {
		fmt.Fprintln(w, "flap:", l)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if base != nil {
		fmt.Fprintf(w, "against the baseline of %s (load %s): before → now (now/before)\n", base.Recorded, base.Load)
		if base.Setup != r.Setup {
			fmt.Fprintf(w, "  note: a different setup: baseline %q, now %q\n", base.Setup, r.Setup)
		}
		now := r.Figures()
		tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
		for _, k := range sortedKeys(now) {
			b, ok := base.Figures[k]
			if !ok {
				continue
			}
			ratio := "-"
			if b != 0 {
				ratio = fmt.Sprintf("%.2f×", now[k]/b)
			}
			mark := ""
			if b > 0 && now[k]/b > 1.25 && now[k]-b > 1 {
				mark = "  <- worse"
			}
			fmt.Fprintf(tw, "  %s\t%s → %s\t%s%s\t\n", k, num(b), num(now[k]), ratio, mark)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, r.Summary())
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 2, 0, 2, ' ', 0) }

func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func round(d time.Duration) time.Duration {
	switch {
	case d > 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d > 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// shortSeries drops the labels that repeat on every API series.
func shortSeries(s string) string {
	for _, l := range []string{`grpc_service="`, `grpc_type="`} {
		for {
			i := strings.Index(s, l)
			if i < 0 {
				break
			}
			j := strings.IndexByte(s[i+len(l):], '"')
			if j < 0 {
				break
			}
			end := i + len(l) + j + 1
			if end < len(s) && s[end] == ',' {
				end++
			}
			s = s[:i] + s[end:]
		}
	}
	s = strings.ReplaceAll(s, `"`, "")
	return strings.TrimSuffix(strings.ReplaceAll(s, ",}", "}"), "{}")
}
