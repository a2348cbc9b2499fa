// Package commission runs a machine's commissioning tests on the machine
// (docs/architecture.md, "Commissioning"): the steps of an appliance's
// CommissionPlan with the real tools (smartctl, memtester, stress-ng,
// fio, ethtool) on every disk and NIC they apply to, each result parsed
// into pass, fail or skip with a one-line summary and a bounded excerpt of
// the tool's output. The tools come from the commissioning overlay, which
// the plan names: when they are not on the machine (a discovery image
// booted without the overlay) the overlay is fetched, checked against the
// plan's size and SHA-256 and unpacked into the root first. It imports
// the API only.
package commission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// Tools are the programs the steps run, by kind; the overlay carries
// them.
var Tools = map[string]string{
	"smart":     "smartctl",
	"memtester": "memtester",
	"stress-ng": "stress-ng",
	"fio":       "fio",
	"link":      "ethtool",
}

// Exec runs a program and returns its output (stdout and stderr
// together) and exit status; err is only for a program that did not run.
type Exec func(ctx context.Context, name string, args ...string) (out []byte, code int, err error)

// Config configures a Runner.
type Config struct {
	// Root is where disks (sys/block) and NICs (sys/class/net) are read
	// and the overlay unpacked; default "/".
	Root    string
	Console io.Writer
	Logger  *slog.Logger
	// Exec defaults to running the program (os/exec) with PATH lookup.
	Exec Exec
	// Fetch opens the overlay's URL; default plain HTTP GET.
	Fetch func(ctx context.Context, url string) (io.ReadCloser, error)
}

// Runner carries out CommissionPlans (agent/session.Commissioner).
type Runner struct{ cfg Config }

// New returns a Runner.
func New(cfg Config) *Runner {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Exec == nil {
		cfg.Exec = runProgram
	}
	if cfg.Fetch == nil {
		cfg.Fetch = httpGet
	}
	return &Runner{cfg: cfg}
}

// Commission runs plan: the overlay when a tool is missing, then every
// step on its targets, each result reported as Progress{step: "test"};
// last Progress{step: "commissioned", done: true} with error naming the
// failed tests. It returns an error only when it could not run at all
// (the overlay), after reporting it.
func (r *Runner) Commission(ctx context.Context, plan *nodev1.CommissionPlan, progress func(*nodev1.Progress)) error {
	id := plan.GetCommissionId()
	start := time.Now()
	if err := r.ensureTools(ctx, plan); err != nil {
		progress(&nodev1.Progress{Step: "commissioned", Done: true, Error: "commissioning overlay: " + err.Error(), InstallId: id})
		return err
	}
	var failed []string
	total := 0
	for _, s := range plan.GetSteps() {
		for _, t := range r.run(ctx, s) {
			total++
			if t.GetResult() == Fail {
				failed = append(failed, strings.TrimSpace(t.GetName()+" "+t.GetTarget()))
			}
			fmt.Fprintf(r.cfg.Console, "corral: commission %s %s: %s: %s\n", t.GetName(), t.GetTarget(), t.GetResult(), t.GetSummary())
			progress(&nodev1.Progress{Step: "test", Detail: t.GetName() + " " + t.GetTarget(), InstallId: id, CommissionTest: t})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	done := &nodev1.Progress{Step: "commissioned", Done: true, InstallId: id,
		Detail: fmt.Sprintf("%d tests in %s", total, time.Since(start).Round(time.Second))}
	if len(failed) > 0 {
		done.Error = fmt.Sprintf("%d of %d tests failed: %s", len(failed), total, strings.Join(failed, ", "))
	}
	progress(done)
	return nil
}

// run runs one step on each of its targets.
func (r *Runner) run(ctx context.Context, s *inventoryv1.CommissionStep) []*inventoryv1.CommissionTest {
	switch s.GetKind() {
	case "smart":
		return r.each(ctx, s, r.disks(), r.smart)
	case "fio":
		return r.each(ctx, s, r.disks(), r.fio)
	case "link":
		return r.each(ctx, s, r.nics(), r.link)
	case "memtester":
		return []*inventoryv1.CommissionTest{r.timed(ctx, s, "", r.memtester)}
	case "stress-ng":
		return []*inventoryv1.CommissionTest{r.timed(ctx, s, "", r.stress)}
	}
	return []*inventoryv1.CommissionTest{{Name: s.GetKind(), Result: Fail, Summary: "unknown test kind"}}
}

type testFn func(ctx context.Context, s *inventoryv1.CommissionStep, target string) (Verdict, string)

func (r *Runner) each(ctx context.Context, s *inventoryv1.CommissionStep, targets []string, fn testFn) []*inventoryv1.CommissionTest {
	if len(targets) == 0 {
		return []*inventoryv1.CommissionTest{{Name: s.GetKind(), Result: Skip, Summary: "nothing to test"}}
	}
	var out []*inventoryv1.CommissionTest
	for _, t := range targets {
		out = append(out, r.timed(ctx, s, t, fn))
	}
	return out
}

func (r *Runner) timed(ctx context.Context, s *inventoryv1.CommissionStep, target string, fn testFn) *inventoryv1.CommissionTest {
	start := time.Now()
	v, output := fn(ctx, s, target)
	return &inventoryv1.CommissionTest{Name: s.GetKind(), Target: target, Result: v.Result, Summary: v.Summary,
		DurationMs: time.Since(start).Milliseconds(), Output: Excerpt(output, MaxOutput)}
}

func (r *Runner) smart(ctx context.Context, s *inventoryv1.CommissionStep, dev string) (Verdict, string) {
	var log strings.Builder
	if s.GetSelfTest() {
		out, _, err := r.cfg.Exec(ctx, "smartctl", "-t", "short", dev)
		if err != nil {
			return Verdict{Result: Fail, Summary: err.Error()}, ""
		}
		log.WriteString(Render(out))
		// A short self-test takes about two minutes; its result is in
		// the log the health check below reads (exit bit 7).
		wait := time.Duration(max(s.GetSeconds(), 1)) * time.Second
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	out, code, err := r.cfg.Exec(ctx, "smartctl", "-H", "-l", "selftest", "-j", dev)
	if err != nil {
		return Verdict{Result: Fail, Summary: err.Error()}, log.String()
	}
	log.WriteString(Render(out))
	return ParseSmart(out, code), log.String()
}

func (r *Runner) fio(ctx context.Context, s *inventoryv1.CommissionStep, dev string) (Verdict, string) {
	secs := max(s.GetSeconds(), 1)
	out, code, err := r.cfg.Exec(ctx, "fio", "--name=read", "--filename="+dev, "--readonly", "--rw=read", "--bs=1M",
		"--direct=1", "--runtime="+strconv.Itoa(int(secs)), "--time_based", "--output-format=json")
	if err != nil {
		return Verdict{Result: Fail, Summary: err.Error()}, ""
	}
	v := ParseFio(out, code)
	if v.Result == Pass && s.GetMinMbps() > 0 && v.Value < float64(s.GetMinMbps()) {
		v = Verdict{Result: Fail, Summary: fmt.Sprintf("%s: below %d MB/s", v.Summary, s.GetMinMbps()), Value: v.Value}
	}
	return v, Render(out)
}

func (r *Runner) memtester(ctx context.Context, s *inventoryv1.CommissionStep, _ string) (Verdict, string) {
	mib, loops := max(s.GetMemoryMib(), 1), max(s.GetLoops(), 1)
	out, code, err := r.cfg.Exec(ctx, "memtester", strconv.Itoa(int(mib))+"M", strconv.Itoa(int(loops)))
	if err != nil {
		return Verdict{Result: Fail, Summary: err.Error()}, ""
	}
	text := Render(out)
	v := ParseMemtester(text, code)
	v.Summary = fmt.Sprintf("%d MiB x%d: %s", mib, loops, v.Summary)
	return v, text
}

func (r *Runner) stress(ctx context.Context, s *inventoryv1.CommissionStep, _ string) (Verdict, string) {
	secs := max(s.GetSeconds(), 1)
	// --cpu 0: one worker per online CPU.
	out, code, err := r.cfg.Exec(ctx, "stress-ng", "--cpu", "0", "--timeout", strconv.Itoa(int(secs))+"s", "--metrics-brief")
	if err != nil {
		return Verdict{Result: Fail, Summary: err.Error()}, ""
	}
	text := Render(out)
	v := ParseStressNG(text, code)
	if v.Result == Pass && s.GetMinBogoOpsPerSecond() > 0 && v.Value < float64(s.GetMinBogoOpsPerSecond()) {
		v = Verdict{Result: Fail, Summary: fmt.Sprintf("%s: below %d", v.Summary, s.GetMinBogoOpsPerSecond()), Value: v.Value}
	}
	return v, text
}

func (r *Runner) link(ctx context.Context, s *inventoryv1.CommissionStep, nic string) (Verdict, string) {
	dir := filepath.Join(r.cfg.Root, "sys/class/net", nic)
	read := func(n string) string { b, _ := os.ReadFile(filepath.Join(dir, n)); return string(b) }
	l := ParseLink(read("carrier"), read("speed"), read("duplex"))
	// ethtool's view for the record; the kernel's numbers decide.
	out, _, err := r.cfg.Exec(ctx, "ethtool", nic)
	text := Render(out)
	if err != nil {
		text = "ethtool: " + err.Error()
	}
	return l.Judge(s.GetMinLinkMbps(), s.GetFullDuplex()), text
}

// disks are the whole disks under Root/sys/block worth testing, as
// /dev paths: not loop, ram, zram, device-mapper, md, optical or
// removable devices.
func (r *Runner) disks() []string {
	ents, _ := os.ReadDir(filepath.Join(r.cfg.Root, "sys/block"))
	var out []string
	for _, e := range ents {
		n := e.Name()
		if hasAnyPrefix(n, "loop", "ram", "zram", "dm-", "md", "sr", "nbd", "fd") {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(r.cfg.Root, "sys/block", n, "removable")); err == nil && strings.TrimSpace(string(b)) == "1" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(r.cfg.Root, "sys/block", n, "size")); err == nil && strings.TrimSpace(string(b)) == "0" {
			continue
		}
		out = append(out, "/dev/"+n)
	}
	sort.Strings(out)
	return out
}

// nics are the physical NICs (with a device behind them) under
// Root/sys/class/net.
func (r *Runner) nics() []string {
	ents, _ := os.ReadDir(filepath.Join(r.cfg.Root, "sys/class/net"))
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(r.cfg.Root, "sys/class/net", e.Name(), "device")); err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// toolDirs are where the overlay puts the tools (Debian's paths), looked
// at when PATH lacks them: u-root's init may not put /usr/sbin on it.
var toolDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// lookTool finds a tool on PATH or in toolDirs.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range toolDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}

// runProgram is the default Exec.
func runProgram(ctx context.Context, name string, args ...string) ([]byte, int, error) {
	path, err := lookTool(name)
	if err != nil {
		return nil, -1, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), ee.ExitCode(), nil
	}
	if err != nil {
		return out.Bytes(), -1, fmt.Errorf("%s: %w", name, err)
	}
	return out.Bytes(), 0, nil
}
