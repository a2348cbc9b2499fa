// Package metrics is the appliance's observability: the Prometheus
// registry and its collectors (gRPC, DHCP, TFTP, boot HTTP, BMC calls,
// store commits, boot phases, machine and node counts), /metrics, /healthz
// and /readyz on their own listener, the gRPC health statuses and the
// systemd notifications. It consumes the rest of the appliance through the
// small interfaces in Deps and must not import the appliance package that
// wires it.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/boot/connlimit"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/boot/dhcp6"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/store"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Config configures /metrics, /healthz and /readyz.
type Config struct {
	// Listen is the metrics and health HTTP listen address ("" = off).
	Listen string
	// ListenIsDefault says Listen is the flag's default (":9180") rather
	// than an operator's choice: when it cannot be bound (another corrald
	// or exporter on the host holds it), the appliance warns and serves
	// without metrics instead of refusing to start. An address the
	// operator chose must bind.
	ListenIsDefault bool
	// HealthInterval is how often the store is checked for gRPC health and
	// the systemd watchdog (default 5s; with a systemd watchdog at most
	// half its period).
	HealthInterval time.Duration
}

// Services lists the gRPC services whose health is set (*grpc.Server).
type Services interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}

// Health is the gRPC health service (*health.Server).
type Health interface {
	SetServingStatus(service string, status healthpb.HealthCheckResponse_ServingStatus)
	Shutdown()
}

// RunGroup takes the long-running parts; they run until the appliance
// stops.
type RunGroup interface {
	Add(name string, run func(ctx context.Context) error)
}

// Deps are what Start needs from the appliance that hosts the metrics.
type Deps struct {
	// Store is read by /readyz and the health loop; the state counts and
	// boot phases follow it.
	Store store.Store
	// Services and Health: every service is SERVING while the store
	// answers.
	Services Services
	Health   Health
	// APIAddr is named in systemd's STATUS.
	APIAddr net.Addr
	// Run takes the health loop, the counts, the phases and the listener.
	Run RunGroup
}

// Bounds of the metrics and health listener: Prometheus scrapes with one
// connection, probes open a few more; the port may face the boot LAN.
const (
	metricsMaxConns      = 64
	metricsMaxConnsPerIP = 8
	metricsMaxHeader     = 8 << 10
	// readyStoreTimeout bounds /readyz's store read.
	readyStoreTimeout = time.Second
)

// Metrics holds the Prometheus registry and collectors. It exists whether
// or not /metrics is served (the boot servers and the BMC controller
// count into it either way; the count is cheap). A nil *Metrics hands out
// nil observers and interceptors.
type Metrics struct {
	cfg  Config
	log  *slog.Logger
	reg  *prometheus.Registry
	grpc *grpcprom.ServerMetrics

	dhcp      *prometheus.CounterVec   // type, outcome
	dhcpTime  *prometheus.HistogramVec // type
	dhcp6     *prometheus.CounterVec   // type, outcome
	leases6   *leases6Gauge            // range, state
	tftp      *prometheus.CounterVec   // file, outcome
	tftpBytes *prometheus.CounterVec   // file
	http      *prometheus.CounterVec   // route, code
	httpBytes *prometheus.CounterVec   // route
	httpTime  *prometheus.HistogramVec // route
	bmc       *prometheus.HistogramVec // op, provider, outcome
	erases    *prometheus.CounterVec   // level, outcome (erases.go)
	reports   *prometheus.CounterVec   // reason
	deploys   *prometheus.CounterVec   // outcome
	store     *storeMetrics
	phases    *phaseTracker
	counts    *stateCounts
	standby   *standbyGauges
	sensors   *sensorGauges // sensors.go
	info      *infoGauges   // info.go
	ranges    *rangeGauges  // info.go

	// leadMu guards leading, whether this appliance leads (info.go).
	leadMu  sync.Mutex
	leading bool

	// lis is the bound metrics listener (nil: off).
	lis net.Listener
	// ready says whether the appliance can serve (health.go).
	ready *readiness
	deps  Deps
}

// New creates the registry and collectors; nothing is bound or started
// until Start. log may be nil (discard).
func New(cfg Config, log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o := &Metrics{cfg: cfg, log: log}
	o.reg = prometheus.NewRegistry()
	o.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.grpc = grpcprom.NewServerMetrics(
		grpcprom.WithServerCounterOptions(grpcprom.WithNamespace("corral_api")),
		grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace("corral_api"),
			grpcprom.WithHistogramBuckets([]float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30})),
	)
	o.dhcp = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_dhcp_packets_total",
		Help: "DHCP packets received, by message type and outcome (offer, ack, nak, ignored, not_sent, dropped_overload, malformed, left_to_peer: a DISCOVER another appliance of the fleet answers)."}, []string{"type", "outcome"})
	o.dhcpTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "corral_dhcp_answer_seconds",
		Help:    "Time from a DHCP request's arrival (the kernel's receive stamp) to its answer's send, by the request's message type: the appliance's share of a client's wait (its queue and a lease's flush to disk included).",
		Buckets: []float64{.0005, .001, .002, .003, .005, .01, .025, .05, .1, .25, 1}}, []string{"type"})
	o.dhcp6 = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_dhcp6_packets_total",
		Help: "DHCPv6 datagrams received, by client message type (relay-forward: refused before its inner message was read; other: did not parse) and outcome (advertise, reply, ignored, malformed, over_budget, relay_refused, no_range, not_sent, dropped_overload)."}, []string{"type", "outcome"})
	o.leases6 = &leases6Gauge{desc: prometheus.NewDesc("corral_dhcp6_leases",
		"DHCPv6 addresses per range (START-END) by state: bound (a live lease) and free (neither bound, offered nor quarantined).", []string{"range", "state"}, nil)}
	o.tftp = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_tftp_transfers_total",
		Help: "TFTP requests, by catalog file (other: not a servable name) and outcome."}, []string{"file", "outcome"})
	o.tftpBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_tftp_sent_bytes_total",
		Help: "TFTP bytes sent, by catalog file."}, []string{"file"})
	o.http = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_boot_http_requests_total",
		Help: "Boot HTTP requests, by route class (script, image, other) and status code."}, []string{"route", "code"})
	o.httpBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_boot_http_sent_bytes_total",
		Help: "Boot HTTP body bytes sent, by route class."}, []string{"route"})
	o.httpTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "corral_boot_http_request_duration_seconds",
		Help:    "Boot HTTP request durations (an image download counts whole), by route class.",
		Buckets: []float64{.001, .005, .025, .1, .5, 1, 5, 15, 60, 180}}, []string{"route"})
	o.bmc = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "corral_bmc_request_duration_seconds",
		Help:    "BMC calls, by operation, the provider that answered (none: none did) and outcome (ok, auth, unreachable, protocol, failed, invalid, certificate).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30}}, []string{"op", "provider", "outcome"})
	o.erases = newEraseCounter(o.reg)
	o.reports = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_report_refusals_total",
		Help: "Agent fact reports refused, by reason (report_bytes, disks, dimms, nics, pci_devices: over a cap; string, control: a string too long, not UTF-8 or holding control characters; invalid; unaccepted_cap: --max-unaccepted machines are registered and not accepted)."}, []string{"reason"})
	o.deploys = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_deploys_total",
		Help: "Operating-system deploys, by outcome (started; deployed: the OS phoned home; failed: a step failed; timed_out: no progress or no phone-home in time)."}, []string{"outcome"})
	for _, v := range []string{"started", "deployed", "failed", "timed_out"} {
		o.deploys.WithLabelValues(v)
	}
	o.store = newStoreMetrics()
	o.phases = newPhaseTracker(log.With("component", "boot-phases"))
	o.counts = newStateCounts(log.With("component", "state-counts"))
	o.standby = newStandbyGauges()
	o.sensors = newSensorGauges()
	o.info = newInfoGauges()
	o.ranges = newRangeGauges()
	o.reg.MustRegister(append(o.info.collectors(), o.ranges)...)
	o.ready = &readiness{}
	o.reg.MustRegister(o.grpc, o.dhcp, o.dhcpTime, o.dhcp6, o.leases6, o.tftp, o.tftpBytes, o.http, o.httpBytes, o.httpTime, o.bmc, o.reports, o.deploys,
		o.store.commit, o.phases.hist, o.counts, o.standby, o.sensors)
	return o
}

// WrapStore returns st with its writes timed
// (corral_store_commit_seconds). Wrapping twice is harmless: a timed
// store is returned as is.
func (o *Metrics) WrapStore(st store.Store) store.Store {
	return o.store.wrap(st)
}

// Interceptors are the gRPC server metrics middleware (nil = off):
// go-grpc-middleware's Prometheus provider, requests by method and code.
// Methods are not pre-registered (that would be every method times every
// code); unknown methods never reach interceptors, so the labels stay the
// registered methods'.
func (o *Metrics) Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	if o == nil {
		return nil, nil
	}
	return o.grpc.UnaryServerInterceptor(), o.grpc.StreamServerInterceptor()
}

// TrackBoot returns run wrapped so that readiness (and READY=1) waits for
// it: the boot server named name counts as serving while run runs.
func (o *Metrics) TrackBoot(name string, run func(ctx context.Context) error) func(ctx context.Context) error {
	flag := o.ready.track(name)
	return func(ctx context.Context) error {
		flag.Store(true)
		defer flag.Store(false)
		return run(ctx)
	}
}

// Start sets the gRPC health of each service, adds the health loop to
// d.Run and binds the metrics and health HTTP listener (when configured),
// adding it and the collectors that follow the store. It is called once,
// last, when every service is registered and every boot server tracked.
func (o *Metrics) Start(d Deps) error {
	o.deps = d
	for name := range d.Services.GetServiceInfo() {
		d.Health.SetServingStatus(name, servingStatus(true))
	}
	d.Health.SetServingStatus("", servingStatus(true))
	o.ready.store = d.Store
	o.standby.follow(d.Store)
	d.Run.Add("health", o.runHealth)

	cfg := o.cfg
	if cfg.Listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return fmt.Errorf("--metrics-listen %q: want host:port, e.g. :9180 or 127.0.0.1:9180", cfg.Listen)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if cfg.ListenIsDefault {
			o.log.Warn("metrics and health listener not started: its default address is taken; set --metrics-listen to a free address, or \"\" to turn it off",
				"addr", cfg.Listen, "err", err)
			return nil
		}
		return fmt.Errorf("--metrics-listen %s: %w", cfg.Listen, err)
	}
	o.lis = connlimit.New(lis, connlimit.Config{MaxConns: metricsMaxConns, MaxConnsPerIP: metricsMaxConnsPerIP, WriteStall: 10 * time.Second,
		Name: "metrics", Logger: o.log.With("component", "metrics")})
	d.Run.Add("state-counts", func(ctx context.Context) error { return o.counts.run(ctx, d.Store) })
	d.Run.Add("boot-phases", func(ctx context.Context) error { return o.phases.run(ctx, d.Store) })
	d.Run.Add("metrics-http", o.serve)
	return nil
}

// Addr is the bound metrics and health address (nil: off).
func (o *Metrics) Addr() net.Addr {
	if o == nil || o.lis == nil {
		return nil
	}
	return o.lis.Addr()
}

// serve serves /metrics, /healthz and /readyz until ctx ends.
func (o *Metrics) serve(ctx context.Context) error {
	log := o.log.With("component", "metrics")
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttpHandler(o.reg, log))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if reason := o.ready.check(r.Context()); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: "+reason)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    metricsMaxHeader,
		ErrorLog:          newLogLogger(log),
	}
	log.Info("serving metrics and health", "addr", o.lis.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(o.lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// The boot servers' and BMC controller's observers.

type dhcpObserver struct{ o *Metrics }

func (d dhcpObserver) Packet(msgType, outcome string) {
	d.o.dhcp.WithLabelValues(msgType, outcome).Inc()
}

func (d dhcpObserver) Answered(msgType string, took time.Duration) {
	d.o.dhcpTime.WithLabelValues(msgType).Observe(took.Seconds())
}

type dhcp6Observer struct{ o *Metrics }

func (d dhcp6Observer) Packet(msgType, outcome string) {
	d.o.dhcp6.WithLabelValues(msgType, outcome).Inc()
}

// leases6Gauge reads the DHCPv6 server's lease counts at each scrape.
type leases6Gauge struct {
	desc  *prometheus.Desc
	stats atomic.Pointer[func() []dhcp6.RangeStat]
}

func (g *leases6Gauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *leases6Gauge) Collect(ch chan<- prometheus.Metric) {
	f := g.stats.Load()
	if f == nil {
		return
	}
	for _, r := range (*f)() {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, r.Bound, r.Range, "bound")
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, r.Free, r.Range, "free")
	}
}

type tftpObserver struct{ o *Metrics }

func (t tftpObserver) Transfer(file, outcome string, n int64) {
	t.o.tftp.WithLabelValues(file, outcome).Inc()
	if n > 0 {
		t.o.tftpBytes.WithLabelValues(file).Add(float64(n))
	}
}

type httpObserver struct{ o *Metrics }

func (h httpObserver) Request(route string, code int, n int64, took time.Duration) {
	h.o.http.WithLabelValues(route, strconv.Itoa(code)).Inc()
	if n > 0 {
		h.o.httpBytes.WithLabelValues(route).Add(float64(n))
	}
	h.o.httpTime.WithLabelValues(route).Observe(took.Seconds())
}

// DHCP returns the observer the DHCP server reports to (nil on a nil
// *Metrics, e.g. an appliance built by hand in a test). TFTP, HTTP and
// BMC do the same for the TFTP and HTTP servers and the BMC controller.
func (o *Metrics) DHCP() dhcp.Observer {
	if o == nil {
		return nil
	}
	return dhcpObserver{o}
}

// DHCP6 returns the DHCPv6 server's observer; see DHCP.
func (o *Metrics) DHCP6() dhcp6.Observer {
	if o == nil {
		return nil
	}
	return dhcp6Observer{o}
}

// DHCP6Leases makes corral_dhcp6_leases follow stats (the DHCPv6
// server's LeaseStats), read at each scrape.
func (o *Metrics) DHCP6Leases(stats func() []dhcp6.RangeStat) {
	if o != nil {
		o.leases6.stats.Store(&stats)
	}
}

// TFTP returns the TFTP server's observer; see DHCP.
func (o *Metrics) TFTP() tftp.Observer {
	if o == nil {
		return nil
	}
	return tftpObserver{o}
}

// HTTP returns the boot HTTP server's observer; see DHCP.
func (o *Metrics) HTTP() boothttp.Observer {
	if o == nil {
		return nil
	}
	return httpObserver{o}
}

// BMC returns the BMC controller's observer; see DHCP.
func (o *Metrics) BMC() func(op, provider, outcome string, took time.Duration) {
	if o == nil {
		return nil
	}
	h := o.bmc
	return func(op, provider, outcome string, took time.Duration) {
		h.WithLabelValues(op, provider, outcome).Observe(took.Seconds())
	}
}

// DeployOutcome returns what the lifecycle calls for each deploy's start
// and outcome (corral_deploys_total; nil on a nil *Metrics). The lifecycle
// bounds the outcomes.
func (o *Metrics) DeployOutcome() func(outcome string) {
	if o == nil {
		return nil
	}
	c := o.deploys
	return func(outcome string) { c.WithLabelValues(outcome).Inc() }
}

// ReportRefused returns what inventory calls for each refused report (nil
// on a nil *Metrics). inventory bounds the reasons.
func (o *Metrics) ReportRefused() func(reason string) {
	if o == nil {
		return nil
	}
	c := o.reports
	return func(reason string) { c.WithLabelValues(reason).Inc() }
}
