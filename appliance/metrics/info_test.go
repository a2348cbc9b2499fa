package metrics

import (
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/boot/dhcp"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestBuildInfo(t *testing.T) {
	o := New(Config{}, nil)
	o.SetBuild("v1.2.3")
	wantGathered(t, o.reg, map[string]float64{
		`corral_build_info{commit="` + commitOf(debug.ReadBuildInfo()) + `",go_version="` + runtime.Version() + `",version="v1.2.3"}`: 1,
	}, "corral_build_info")
	for name, tc := range map[string]struct {
		settings []debug.BuildSetting
		want     string
	}{
		"clean":       {[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}}, "0123456789ab"},
		"dirty":       {[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}, "0123456789ab-dirty"},
		"no revision": {nil, "unknown"},
	} {
		if got := commitOf(&debug.BuildInfo{Settings: tc.settings}, true); got != tc.want {
			t.Errorf("%s: commit %q, want %q", name, got, tc.want)
		}
	}
	if got := commitOf(nil, false); got != "unknown" {
		t.Errorf("no build info: %q", got)
	}
}

// TestLeading: corral_leader follows the lead, and only a gain of the
// lead counts a change (losing it, or being told twice, does not).
func TestLeading(t *testing.T) {
	o := New(Config{}, nil)
	leader := func() (float64, float64) {
		g := gathered(t, o.reg, "corral_leader", "corral_leader_changes_total")
		return g["corral_leader{}"], g["corral_leader_changes_total{}"]
	}
	if l, c := leader(); l != 0 || c != 0 {
		t.Errorf("before any election: corral_leader %v, changes %v", l, c)
	}
	for i, step := range []struct {
		lead    bool
		leader  float64
		changes float64
	}{{true, 1, 1}, {true, 1, 1}, {false, 0, 1}, {false, 0, 1}, {true, 1, 2}} {
		o.Leading(step.lead)
		if l, c := leader(); l != step.leader || c != step.changes {
			t.Errorf("step %d (lead %v): corral_leader %v, changes %v; want %v, %v", i, step.lead, l, c, step.leader, step.changes)
		}
	}
	var nilM *Metrics
	nilM.Leading(true) // must not panic
	nilM.CertificateExpiry("ca", time.Now())
	nilM.SetBuild("x")
	nilM.DHCPRanges(func() []dhcp.RangeUsage { return nil })
}

func TestCertificateExpiry(t *testing.T) {
	o := New(Config{}, nil)
	o.CertificateExpiry("ca", time.Unix(2_000_000_000, 0))
	o.CertificateExpiry("server", time.Unix(1_800_000_000, 0))
	wantGathered(t, o.reg, map[string]float64{
		`corral_certificate_expiry_timestamp_seconds{cert="ca"}`:     2e9,
		`corral_certificate_expiry_timestamp_seconds{cert="server"}`: 1.8e9,
	}, "corral_certificate_expiry_timestamp_seconds")
}

// TestDHCPRanges: nothing before a source is set (proxy mode), then each
// range's size and free addresses as the source reports them at scrape.
func TestDHCPRanges(t *testing.T) {
	o := New(Config{}, nil)
	if n := seriesCount(t, o.ranges, "corral_dhcp_range_free_addresses"); n != 0 {
		t.Errorf("without ranges: %d series", n)
	}
	free := uint64(10)
	o.DHCPRanges(func() []dhcp.RangeUsage {
		return []dhcp.RangeUsage{{Range: "10.0.1.10-10.0.1.19", Size: 10, Free: 3}, {Range: "10.0.0.100-10.0.0.199", Size: 100, Free: free}}
	})
	fams := []string{"corral_dhcp_range_free_addresses", "corral_dhcp_range_size_addresses"}
	want := map[string]float64{
		`corral_dhcp_range_free_addresses{range="10.0.0.100-10.0.0.199"}`: 10,
		`corral_dhcp_range_free_addresses{range="10.0.1.10-10.0.1.19"}`:   3,
		`corral_dhcp_range_size_addresses{range="10.0.0.100-10.0.0.199"}`: 100,
		`corral_dhcp_range_size_addresses{range="10.0.1.10-10.0.1.19"}`:   10,
	}
	wantGathered(t, o.reg, want, fams...)
	free = 0
	want[`corral_dhcp_range_free_addresses{range="10.0.0.100-10.0.0.199"}`] = 0
	wantGathered(t, o.reg, want, fams...)
}

// gathered is every sample of the named families in reg, keyed
// name{label="value",...} (labels sorted by name, as Gather returns them).
func gathered(t *testing.T, reg *prometheus.Registry, families ...string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !slices.Contains(families, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+strconv.Quote(lp.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

func wantGathered(t *testing.T, reg *prometheus.Registry, want map[string]float64, families ...string) {
	t.Helper()
	if d := cmp.Diff(want, gathered(t, reg, families...)); d != "" {
		t.Errorf("%v (-want +got):\n%s", families, d)
	}
}
