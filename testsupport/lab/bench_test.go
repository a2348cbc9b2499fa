package lab

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFigures(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tests := map[string]struct {
		m    MachineFigures
		want map[string]float64
	}{
		"two boots": {
			m: MachineFigures{
				Boots: []Boot{
					{Intent: "discover", Power: at(0), DHCP: at(2), Script: at(3), Kernel: at(3.5), Initrd: at(4), Agent: at(14), Last: at(20)},
					{Intent: "hypervisor", Power: at(20), DHCP: at(23), Script: at(23.5), Kernel: at(24), Initrd: at(25), Agent: at(35), Last: at(35)},
				},
				Power: at(0), Inventoried: at(14), Installed: at(18), Ready: at(35),
			},
			want: map[string]float64{
				"discover POWER→DHCP": 2, "discover DHCP→SCRIPT": 1, "discover SCRIPT→KERNEL+INITRD": 1, "discover INITRD→AGENT": 10, "discover AGENT→LAST": 6,
				"hypervisor POWER→DHCP": 3, "hypervisor DHCP→SCRIPT": 0.5, "hypervisor SCRIPT→KERNEL+INITRD": 1.5, "hypervisor INITRD→AGENT": 10,
				"POWER→INVENTORIED": 14, "POWER→INSTALL DONE": 18, "POWER→READY": 35,
			},
		},
		"not ready yet, no hypervisor boot": {
			m: MachineFigures{
				Boots: []Boot{{Intent: "discover", DHCP: at(2), Script: at(3), Kernel: at(4), Agent: at(14), Last: at(15)}},
				Power: at(2), Inventoried: at(14),
			},
			want: map[string]float64{"discover DHCP→SCRIPT": 1, "discover SCRIPT→KERNEL+INITRD": 1, "discover INITRD→AGENT": 10, "discover AGENT→LAST": 1, "POWER→INVENTORIED": 12},
		},
		"kexec into the hypervisor image": {
			m: MachineFigures{
				Boots: []Boot{
					{Intent: "discover", Power: at(0), DHCP: at(2), Script: at(3), Kernel: at(3.5), Initrd: at(4), Agent: at(14), Last: at(20)},
					{Intent: "hypervisor/kexec", Power: at(20), Script: at(20), Kernel: at(21), Initrd: at(22), Agent: at(30), Last: at(30)},
				},
				Power: at(0), Inventoried: at(14), Installed: at(20), Ready: at(30),
			},
			want: map[string]float64{
				"discover POWER→DHCP": 2, "discover DHCP→SCRIPT": 1, "discover SCRIPT→KERNEL+INITRD": 1, "discover INITRD→AGENT": 10, "discover AGENT→LAST": 6,
				"hypervisor SCRIPT→KERNEL+INITRD": 2, "hypervisor INITRD→AGENT": 8,
				"POWER→INVENTORIED": 14, "POWER→INSTALL DONE": 20, "POWER→READY": 30,
			},
		},
		"a second discovery boot is not counted": {
			m: MachineFigures{Boots: []Boot{
				{Intent: "discover", DHCP: at(1), Script: at(2)},
				{Intent: "discover", DHCP: at(10), Script: at(15)},
			}},
			want: map[string]float64{"discover DHCP→SCRIPT": 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.m.Figures()); diff != "" {
				t.Errorf("Figures (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	tests := map[string]struct {
		in   []float64
		want float64
	}{
		"one":  {[]float64{3}, 3},
		"odd":  {[]float64{5, 1, 3}, 3},
		"even": {[]float64{4, 1, 3, 2}, 2.5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := median(tc.in); got != tc.want {
				t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestPrintComparison(t *testing.T) {
	base := &Baseline{Recorded: "2026-11-21", Firmware: map[string]map[string]float64{"bios": {"POWER→READY": 62.9}}}
	now := &Baseline{Firmware: map[string]map[string]float64{
		"bios": {"POWER→READY": 40.0, "POWER→INVENTORIED": 14.0},
		"uefi": {"POWER→READY": 50.0},
	}}
	samples := map[string]map[string][]float64{"bios": {"POWER→READY": {39, 40, 41}}}
	var b bytes.Buffer
	if err := PrintComparison(&b, base, now, samples); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"baseline: 2026-11-21", "62.9s", "40.0s", "×0.64", "39.0 40.0 41.0", "UEFI"} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
	// Figures print in FigureNames order: INVENTORIED before READY.
	if strings.Index(out, "POWER→INVENTORIED") > strings.Index(out, "POWER→READY") {
		t.Errorf("figures out of order:\n%s", out)
	}
}
