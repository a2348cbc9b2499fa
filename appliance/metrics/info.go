package metrics

import (
	"runtime"
	"runtime/debug"
	"sort"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/boot/dhcp"
	"github.com/prometheus/client_golang/prometheus"
)

// The gauges the shipped alert rules and dashboard read besides the
// traffic counters (packaging/prometheus): what runs, who leads, when the
// certificates end and how full each DHCP range is.

// infoGauges are corral_build_info, corral_leader,
// corral_leader_changes_total and
// corral_certificate_expiry_timestamp_seconds.
type infoGauges struct {
	build   *prometheus.GaugeVec
	leader  prometheus.Gauge
	changes prometheus.Counter
	expiry  *prometheus.GaugeVec
}

func newInfoGauges() *infoGauges {
	return &infoGauges{
		build: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "corral_build_info",
			Help: "Always 1: the corrald build, as labels (version, the commit it was built from, the Go release)."}, []string{"version", "commit", "go_version"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "corral_leader",
			Help: "1 while this appliance leads (runs the singleton work: reconcilers, sweeps, dispatch), else 0. An appliance alone on its store always leads."}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "corral_leader_changes_total",
			Help: "Times this appliance became leader; summed over a fleet, the number of leader changes."}),
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "corral_certificate_expiry_timestamp_seconds",
			Help: "When a certificate this appliance serves with ends (its NotAfter, Unix seconds), by certificate (ca: the appliance CA; server: the API and web certificate)."}, []string{"cert"}),
	}
}

func (g *infoGauges) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.build, g.leader, g.changes, g.expiry}
}

// commitOf is the VCS revision the binary was built from, as the Go
// toolchain stamped it ("unknown" when built outside a checkout; a
// "-dirty" suffix when the tree had changes).
func commitOf(info *debug.BuildInfo, ok bool) string {
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// SetBuild sets corral_build_info{version, commit, go_version} to 1: the
// version is the one linked into the binary; the commit and the Go
// release are read from the binary's build information. Call it once.
func (o *Metrics) SetBuild(version string) {
	if o == nil {
		return
	}
	o.info.build.Reset()
	o.info.build.WithLabelValues(version, commitOf(debug.ReadBuildInfo()), runtime.Version()).Set(1)
}

// Leading records whether this appliance leads (corral_leader); each
// move from not leading to leading counts one leader change. Safe for
// concurrent use; nil-safe.
func (o *Metrics) Leading(lead bool) {
	if o == nil {
		return
	}
	o.leadMu.Lock()
	defer o.leadMu.Unlock()
	if lead && !o.leading {
		o.info.changes.Inc()
	}
	o.leading = lead
	o.info.leader.Set(b2f(lead))
}

// CertificateExpiry records when the certificate named cert ends
// (corral_certificate_expiry_timestamp_seconds{cert}); the name is one of
// the appliance's own (ca, server), never a client's. Nil-safe.
func (o *Metrics) CertificateExpiry(cert string, notAfter time.Time) {
	if o == nil {
		return
	}
	o.info.expiry.WithLabelValues(cert).Set(float64(notAfter.Unix()))
}

// DHCPRanges exports each full-mode DHCP range's size and free addresses
// (corral_dhcp_range_size_addresses, corral_dhcp_range_free_addresses,
// labelled range="START-END"), read from usage at each scrape. usage must
// be quick and safe for concurrent use (dhcp.Server.RangeUsage). A later
// call replaces the earlier one's source; nil-safe.
func (o *Metrics) DHCPRanges(usage func() []dhcp.RangeUsage) {
	if o == nil || usage == nil {
		return
	}
	o.ranges.usage.Store(&usage)
}

// rangeGauges reads the DHCP ranges' usage at each scrape (none until
// DHCPRanges names a source: proxy mode has no ranges).
type rangeGauges struct {
	usage      atomic.Pointer[func() []dhcp.RangeUsage]
	size, free *prometheus.Desc
}

func newRangeGauges() *rangeGauges {
	return &rangeGauges{
		size: prometheus.NewDesc("corral_dhcp_range_size_addresses", "Addresses in a full-mode DHCP range (START-END inclusive).", []string{"range"}, nil),
		free: prometheus.NewDesc("corral_dhcp_range_free_addresses",
			"Addresses of a full-mode DHCP range that a new client can be given now: not bound to a live or pinned lease, not quarantined after a DECLINE, not offered to another client.", []string{"range"}, nil),
	}
}

func (g *rangeGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.size
	ch <- g.free
}

func (g *rangeGauges) Collect(ch chan<- prometheus.Metric) {
	f := g.usage.Load()
	if f == nil {
		return
	}
	us := (*f)()
	sort.Slice(us, func(i, j int) bool { return us[i].Range < us[j].Range })
	for _, u := range us {
		ch <- prometheus.MustNewConstMetric(g.size, prometheus.GaugeValue, float64(u.Size), u.Range)
		ch <- prometheus.MustNewConstMetric(g.free, prometheus.GaugeValue, float64(u.Free), u.Range)
	}
}
