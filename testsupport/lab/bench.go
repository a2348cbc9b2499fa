package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// FigureNames are the figures Bench prints per firmware, in order: the
// phases of the first discovery boot and of the first hypervisor boot
// (Report's columns), then the milestones from power-on.
var FigureNames = []string{
	"discover POWER→DHCP", "discover DHCP→SCRIPT", "discover SCRIPT→KERNEL+INITRD", "discover INITRD→AGENT", "discover AGENT→LAST",
	"hypervisor POWER→DHCP", "hypervisor DHCP→SCRIPT", "hypervisor SCRIPT→KERNEL+INITRD", "hypervisor INITRD→AGENT",
	"POWER→INVENTORIED", "POWER→INSTALL DONE", "POWER→READY",
}

// Figures returns m's figures in seconds by FigureNames; a figure whose
// milestones the timeline lacks is absent (e.g. the hypervisor boot's
// DHCP when it was entered by kexec).
func (m MachineFigures) Figures() map[string]float64 {
	f := map[string]float64{}
	put := func(name string, a, b time.Time) {
		if !a.IsZero() && !b.IsZero() && !b.Before(a) {
			f[name] = b.Sub(a).Seconds()
		}
	}
	seen := map[string]bool{}
	for _, b := range m.Boots {
		// A kexec'd hypervisor boot (intent hypervisor/kexec) has no
		// DHCP: its SCRIPT→KERNEL+INITRD is the kexec to the agent's
		// fetches.
		intent, _, _ := strings.Cut(b.Intent, "/")
		if intent != "discover" && intent != "hypervisor" || seen[intent] {
			continue
		}
		seen[intent] = true
		initrd := firstNonZero(b.Initrd, b.Kernel)
		put(intent+" POWER→DHCP", b.Power, b.DHCP)
		put(intent+" DHCP→SCRIPT", b.DHCP, b.Script)
		put(intent+" SCRIPT→KERNEL+INITRD", b.Script, initrd)
		put(intent+" INITRD→AGENT", initrd, b.Agent)
		if intent == "discover" {
			put(intent+" AGENT→LAST", b.Agent, b.Last)
		}
	}
	put("POWER→INVENTORIED", m.Power, m.Inventoried)
	put("POWER→INSTALL DONE", m.Power, m.Installed)
	put("POWER→READY", m.Power, m.Ready)
	return f
}

// Baseline is the last recorded set of figures (bench/lab-baseline.json):
// seconds per firmware and figure name.
type Baseline struct {
	Recorded string                        `json:"recorded"`
	Note     string                        `json:"note,omitempty"`
	Load     string                        `json:"load,omitempty"`
	Firmware map[string]map[string]float64 `json:"firmware"`
}

// ReadBaseline reads a Baseline file.
func ReadBaseline(path string) (*Baseline, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var bl Baseline
	if err := json.Unmarshal(b, &bl); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &bl, nil
}

// BenchConfig configures Bench.
type BenchConfig struct {
	Up   Config // the lab of every round; Until is forced to ready
	Runs int    // rounds (default 5)
	// Baseline is the file of the last recorded figures ("" or missing:
	// none); Record, when set, is where the medians are written as a new
	// baseline.
	Baseline, Record string
	Out              io.Writer
}

// Bench runs cfg.Runs rounds of up (wait until every machine's node is
// READY), measure, down, and prints each round's report, then per
// firmware the median of every figure beside the baseline's (before →
// now, ratio). It asserts nothing. The lab is down when it returns.
func Bench(ctx context.Context, cfg BenchConfig) error {
	if cfg.Runs <= 0 {
		cfg.Runs = 5
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	up := cfg.Up
	up.Until = UntilReady
	up.Accept = true
	if up.Out == nil {
		up.Out = io.Discard
	}
	var base *Baseline
	if cfg.Baseline != "" {
		b, err := ReadBaseline(cfg.Baseline)
		switch {
		case err == nil:
			base = b
		case errors.Is(err, os.ErrNotExist):
			fmt.Fprintf(cfg.Out, "no baseline at %s\n", cfg.Baseline)
		default:
			return err
		}
	}
	samples := map[string]map[string][]float64{} // firmware → figure → one per machine and round
	var loads []string
	consoles := filepath.Join(up.Dir, "bench")
	if err := os.RemoveAll(consoles); err != nil {
		return err
	}
	for r := 1; r <= cfg.Runs; r++ {
		start := time.Now()
		fmt.Fprintf(cfg.Out, "round %d/%d: up (load %s)\n", r, cfg.Runs, loadAvg())
		round := filepath.Join(consoles, fmt.Sprintf("round-%d", r))
		stopStamps, err := StampConsoles(up.Dir, round)
		if err != nil {
			return err
		}
		_, err = Up(ctx, up)
		var ms []MachineFigures
		if err == nil {
			ms, err = Measure(ctx, up.Dir)
		}
		if serr := stopStamps(); serr != nil {
			fmt.Fprintf(cfg.Out, "round %d/%d: console copies incomplete: %v\n", r, cfg.Runs, serr)
		}
		load := loadAvg()
		loads = append(loads, load)
		if derr := Down(context.WithoutCancel(ctx), up.Dir, io.Discard); derr != nil && err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		fmt.Fprintf(cfg.Out, "round %d/%d: %s, load %s at the end; consoles stamped with the host clock in %s\n", r, cfg.Runs, time.Since(start).Round(time.Second), load, round)
		if err := PrintReport(cfg.Out, ms); err != nil {
			return err
		}
		fmt.Fprintln(cfg.Out)
		for _, m := range ms {
			fw := m.Firmware
			if samples[fw] == nil {
				samples[fw] = map[string][]float64{}
			}
			for k, v := range m.Figures() {
				samples[fw][k] = append(samples[fw][k], v)
			}
		}
	}
	now := Baseline{Recorded: time.Now().UTC().Format(time.DateOnly), Load: strings.Join(loads, "; "),
		Note: fmt.Sprintf("medians of %d corral-lab bench rounds", cfg.Runs), Firmware: map[string]map[string]float64{}}
	for fw, figs := range samples {
		now.Firmware[fw] = map[string]float64{}
		for k, vs := range figs {
			now.Firmware[fw][k] = median(vs)
		}
	}
	if err := PrintComparison(cfg.Out, base, &now, samples); err != nil {
		return err
	}
	if cfg.Record != "" {
		b, _ := json.MarshalIndent(now, "", "  ")
		if err := os.WriteFile(cfg.Record, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(cfg.Out, "recorded as the new baseline in %s\n", cfg.Record)
	}
	return nil
}

// PrintComparison prints now's figures per firmware beside base's
// (nil: none) as before → now with now/before, and the samples each
// median came from.
func PrintComparison(w io.Writer, base, now *Baseline, samples map[string]map[string][]float64) error {
	if base != nil {
		fmt.Fprintf(w, "baseline: %s (%s; load %s)\n", base.Recorded, orDash(base.Note), orDash(base.Load))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "FW\tFIGURE\tBEFORE\tNOW (median)\tNOW/BEFORE\tSAMPLES\t")
	fws := make([]string, 0, len(now.Firmware))
	for fw := range now.Firmware {
		fws = append(fws, fw)
	}
	slices.Sort(fws)
	for _, fw := range fws {
		for _, name := range FigureNames {
			v, ok := now.Firmware[fw][name]
			if !ok {
				continue
			}
			before, ratio := "-", "-"
			if base != nil {
				if b, ok := base.Firmware[fw][name]; ok {
					before = fmt.Sprintf("%.1fs", b)
					if b > 0 {
						ratio = fmt.Sprintf("×%.2f", v/b)
					}
				}
			}
			var ss []string
			for _, s := range samples[fw][name] {
				ss = append(ss, fmt.Sprintf("%.1f", s))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.1fs\t%s\t%s\t\n", strings.ToUpper(fw), name, before, v, ratio, strings.Join(ss, " "))
		}
	}
	return tw.Flush()
}

// median of vs (not empty); the mean of the middle two for an even count.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// loadAvg is the machine's 1/5/15-minute load average ("?" unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
