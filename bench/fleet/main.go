// Command fleet prints the figures of several appliances on one etcd
// cluster (docs/fleet.md); it asserts nothing. It builds corrald (go build, no
// -race), starts a real 3-member etcd cluster on loopback
// (testsupport/etcdtest: Debian's etcd-server) and runs corrald processes
// on it, driven over real gRPC/TLS with the admin token of admin.conf:
//
//   - API round trips/s and p50/p99 latency with 1 and 32 closed-loop
//     clients, each on its own connection: a read (GetNode), a write
//     (ReserveCompute + ReleaseCompute on the client's own node) and the
//     same write on one node shared by every client, against one corrald on
//     bbolt, one corrald on etcd, and two corrald on etcd with the clients
//     split between them. The columns are measured interleaved (their order
//     rotating) and the medians over the repeats are printed.
//   - Leader takeover: two corrald on etcd; the leader is killed with
//     SIGKILL and restarted, -kills times per lease TTL; the time from the
//     kill until the other logs "leading the fleet".
//   - Work re-dispatch: two corrald on etcd at the production runner timers
//     (10 s heartbeat, 30 s expiry) with -machines machine records; the
//     runner that is not the leader is killed with SIGKILL; the time until
//     ListAppliances shows its machines on the survivor, and the leader's
//     own account (after_heartbeat).
//
// Everything runs on this machine: clients, corrald and etcd share its
// cores, so figures are relative, not capacity.
//
// Usage: go run ./bench/fleet [-parts api,takeover,redispatch] [-repeats 5]
// [-duration 3s] [-kills 10] [-ttls 15s,5s] [-machines 1000]
// [-redispatch-kills 5] [-dir DIR] [-keep]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corralhq/corral/testsupport/etcdtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench/fleet:", err)
		os.Exit(1)
	}
}

type config struct {
	parts           map[string]bool
	api             apiConfig
	kills           int
	ttls            []time.Duration
	machines        int
	redispatchKills int
	dir             string
	keep            bool
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	parts := fs.String("parts", "api,takeover,redispatch", "what to measure, comma-separated: api, takeover, redispatch")
	repeats := fs.Int("repeats", 5, "api: interleaved runs of every cell and column")
	clients := fs.String("clients", "1,32", "api: concurrent clients, comma-separated")
	dur := fs.Duration("duration", 3*time.Second, "api: measured time of one cell")
	warm := fs.Duration("warmup", 500*time.Millisecond, "api: unmeasured calls before each cell")
	kills := fs.Int("kills", 10, "takeover: leader kills per lease TTL")
	ttls := fs.String("ttls", "15s,5s", "takeover: leader lease TTLs (--leader-lease-ttl), comma-separated")
	machines := fs.Int("machines", 1000, "redispatch: machine records")
	rkills := fs.Int("redispatch-kills", 5, "redispatch: runner kills")
	dir := fs.String("dir", "", "work directory (default a new one in $TMPDIR; on disk, as bbolt and etcd fsync)")
	keep := fs.Bool("keep", false, "keep the work directory (logs of every corrald and etcd member)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := &config{parts: map[string]bool{}, api: apiConfig{repeats: *repeats, dur: *dur, warm: *warm},
		kills: *kills, machines: *machines, redispatchKills: *rkills, dir: *dir, keep: *keep}
	for _, p := range strings.Split(*parts, ",") {
		p = strings.TrimSpace(p)
		if p != "api" && p != "takeover" && p != "redispatch" {
			return nil, fmt.Errorf("-parts: %q is not api, takeover or redispatch", p)
		}
		cfg.parts[p] = true
	}
	for _, s := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-clients: %q is not a number of clients from 1 to 256", s)
		}
		cfg.api.clients = append(cfg.api.clients, n)
	}
	for _, s := range strings.Split(*ttls, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 2*time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("-ttls: %q is not a lease TTL (whole seconds, at least 2s)", s)
		}
		cfg.ttls = append(cfg.ttls, d)
	}
	switch {
	case cfg.api.repeats < 1 || cfg.api.dur <= 0 || cfg.api.warm < 0:
		return nil, errors.New("-repeats must be at least 1, -duration positive, -warmup not negative")
	case cfg.kills < 1 || cfg.redispatchKills < 1:
		return nil, errors.New("-kills and -redispatch-kills must be at least 1")
	case cfg.machines < 2 || cfg.machines > 50_000:
		return nil, errors.New("-machines: from 2 to 50000 (the dispatcher's bound)")
	}
	return cfg, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	root := cfg.dir
	if root == "" {
		if root, err = os.MkdirTemp("", "corral-bench-fleet"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if root, err = filepath.Abs(root); err != nil {
		return err
	}
	if cfg.keep {
		fmt.Fprintln(stderr, "work directory (kept):", root)
	} else {
		defer os.RemoveAll(root)
	}
	began := time.Now()
	bin := filepath.Join(root, "bin")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "./cmd/corrald")
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/corrald (run from the repository root): %w", err)
	}
	corraldBin := filepath.Join(bin, "corrald")
	etcdDir := filepath.Join(root, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return err
	}
	cl, err := etcdtest.Start(etcdDir, 3)
	if err != nil {
		return err
	}
	defer cl.Stop()
	fmt.Fprintf(stdout, "fleet benchmark: %d CPUs, load average %s; etcd %s (3 members on loopback, data in %s)\n",
		runtime.NumCPU(), loadavg(), etcdVersion(), root)

	var summary strings.Builder
	if cfg.parts["api"] {
		fmt.Fprintf(&summary, "\nAPI round trips (load average before: %s)\n\n", loadavg())
		table, err := benchAPI(ctx, stdout, corraldBin, root, cl, cfg.api)
		if err != nil {
			return fmt.Errorf("api: %w", err)
		}
		summary.WriteString(table)
	}
	if cfg.parts["takeover"] {
		fmt.Fprintf(&summary, "\nLeader takeover, SIGKILL of the leader of two → the other logs %q (load average before: %s)\n\n", lineLeading, loadavg())
		summary.WriteString("| lease TTL | kills | median | min | max |\n|---|---|---|---|---|\n")
		for _, ttl := range cfg.ttls {
			took, err := benchTakeover(ctx, stdout, corraldBin, root, cl, ttl, cfg.kills)
			if err != nil {
				return fmt.Errorf("takeover at TTL %v: %w", ttl, err)
			}
			fmt.Fprintf(&summary, "| %v | %d | %v | %v | %v |\n", ttl, len(took), sec(median(took)), sec(slices.Min(took)), sec(slices.Max(took)))
		}
	}
	if cfg.parts["redispatch"] {
		fmt.Fprintf(&summary, "\nWork re-dispatch, SIGKILL of a runner (heartbeat 10 s, expiry 30 s), %d machines (load average before: %s)\n\n", cfg.machines, loadavg())
		samples, err := benchRedispatch(ctx, stdout, corraldBin, root, cl, cfg.machines, cfg.redispatchKills)
		if err != nil {
			return fmt.Errorf("redispatch: %w", err)
		}
		var listed, logged []time.Duration
		var beats []string
		for _, s := range samples {
			listed, logged, beats = append(listed, s.listed), append(logged, s.logged), append(beats, s.afterBeat)
		}
		summary.WriteString("| from the kill until | median | min | max |\n|---|---|---|---|\n")
		fmt.Fprintf(&summary, "| the leader logged the re-dispatch | %v | %v | %v |\n", sec(median(logged)), sec(slices.Min(logged)), sec(slices.Max(logged)))
		fmt.Fprintf(&summary, "| ListAppliances shows every machine on the survivor (polled every 200 ms) | %v | %v | %v |\n", sec(median(listed)), sec(slices.Min(listed)), sec(slices.Max(listed)))
		fmt.Fprintf(&summary, "\nafter_heartbeat (last heartbeat → assignments written), per kill: %s\n", strings.Join(beats, ", "))
	}
	fmt.Fprintf(stdout, "\n== summary (%v in all; load average now %s)\n%s", time.Since(began).Round(time.Second), loadavg(), summary.String())
	return nil
}

func loadavg() string {
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

func etcdVersion() string {
	out, err := exec.Command("etcd", "--version").Output()
	if err != nil {
		return "?"
	}
	v, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(v, "etcd Version: ")
}

// sec renders a takeover or re-dispatch time in seconds.
func sec(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
