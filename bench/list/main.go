// Command list measures `corral get machines` against the built corrald
// holding N inventoried machines with realistic facts (testsupport's
// machinefacts.Server: 16 DIMMs, 4 disks, 4 NICs, two fact changes):
// time to the first row, total time, output size, the client's peak RSS
// and the server's (VmHWM) after the listing. It prints; it asserts
// nothing. The machines are written into the data directory's store
// offline (corrald stopped), so 50,000 take seconds, not a storm.
//
//	go build -o /tmp/corral-bin/ ./cmd/corrald ./cmd/corral
//	go run ./bench/list -bin /tmp/corral-bin -machines 5000,50000
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/bench/internal/benchd"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func main() {
	bin := flag.String("bin", "", "directory holding the built corrald and corral (required)")
	counts := flag.String("machines", "5000,50000", "comma-separated machine counts")
	work := flag.String("work-dir", "", "where the data directories go (default: a temporary directory)")
	flag.BoolVar(&withJSON, "json", true, "also time -o json (minutes at 50,000 machines)")
	flag.BoolVar(&reuse, "reuse", false, "keep the machines a previous run left in -work-dir (written again when absent)")
	flag.BoolVar(&startupOnly, "startup-only", false, "only start corrald, wait for its start-up reads to settle, print its peak RSS and stop")
	flag.Parse()
	if err := run(*bin, *counts, *work); err != nil {
		fmt.Fprintln(os.Stderr, "list:", err)
		os.Exit(1)
	}
}

// withJSON says whether -o json is timed too; reuse keeps a filled data
// directory; startupOnly measures start-up and lists nothing.
var withJSON, reuse, startupOnly = true, false, false

func run(bin, counts, work string) error {
	if bin == "" {
		return errors.New("-bin is required")
	}
	if work == "" {
		d, err := os.MkdirTemp("", "corral-bench-list")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		work = d
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("bench list: %s, load %s", time.Now().UTC().Format(time.RFC3339), load)
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			return fmt.Errorf("-machines: %q is not a count", c)
		}
		if err := one(bin, filepath.Join(work, strconv.Itoa(n)), n); err != nil {
			return fmt.Errorf("%d machines: %w", n, err)
		}
	}
	return nil
}

func one(bin, dir string, n int) error {
	db := filepath.Join(dir, "corral.db")
	if _, err := os.Stat(db); err != nil || !reuse {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		// First start: the data directory gets its CA and admin.conf.
		d, err := start(bin, dir)
		if err != nil {
			return err
		}
		d.Stop()
		t0 := time.Now()
		if err := benchd.Fill(db, n, 16, history); err != nil {
			return err
		}
		fi, _ := os.Stat(db)
		fmt.Printf("\n%d machines written offline in %v (corral.db %d MB)\n", n, time.Since(t0).Round(time.Millisecond), fi.Size()>>20)
	}
	t0 := time.Now()
	d, err := start(bin, dir)
	if err != nil {
		return err
	}
	defer d.Stop()
	fmt.Printf("corrald started: RSS %d MB (anonymous %d MB, file %d MB)\n", d.Status("VmRSS")>>10, d.Status("RssAnon")>>10, d.Status("RssFile")>>10)
	settled, err := settle(d)
	if err != nil {
		return err
	}
	fmt.Printf("corrald start-up settled in %.1f s (machine counts synced, RSS steady 3 s): RSS %d MB (anonymous %d MB, file %d MB), peak RSS (VmHWM) %d MB\n",
		settled.Sub(t0).Seconds(), d.Status("VmRSS")>>10, d.Status("RssAnon")>>10, d.Status("RssFile")>>10, d.Status("VmHWM")>>10)
	if startupOnly {
		return nil
	}
	for _, args := range [][]string{{"get", "machines"}, {"get", "machines", "-o", "json"}, {"get", "machines", "--limit", "100"}, {"get", "machines", "--sort-by", "updated_at desc", "--limit", "20"}} {
		if !withJSON && slices.Contains(args, "json") {
			continue
		}
		r, err := corral(bin, dir, args...)
		if err != nil {
			return err
		}
		fmt.Printf("corral %-45s first row %7.0f ms, total %7.0f ms, %7d lines, %6d KB out, client peak RSS %4d MB, corrald peak RSS %4d MB\n",
			strings.Join(args, " "), ms(r.first), ms(r.total), r.lines, r.bytes>>10, r.maxRSS>>10, d.Status("VmHWM")>>10)
	}
	return nil
}

// start runs corrald on loopback and waits until its API serves.
func start(bin, dir string) (*benchd.Daemon, error) {
	return benchd.Start(benchd.Config{Bin: bin, Dir: dir, Ready: "serving gRPC API"})
}

// history is each machine's fact history: two fact changes.
func history() []*inventoryv1.FactChange {
	return []*inventoryv1.FactChange{
		{At: timestamppb.Now(), Path: "memory.total_bytes", Before: "274877906944", After: "549755813888"},
		{At: timestamppb.Now(), Path: "bios.version", Before: "2.18.0", After: "2.19.1"},
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// settle waits until corrald's machine counts follow the store (its
// start-up read of every machine is done) and its RSS has not moved for
// 3 s (the other start-up reads, such as the fleet's mirror, are done too).
func settle(d *benchd.Daemon) (time.Time, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for !synced(d) {
		if time.Now().After(deadline) {
			return time.Time{}, errors.New("corrald's machine counts did not sync in 5 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	at, last := time.Now(), d.Status("VmRSS")
	for time.Since(at) < 3*time.Second && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
		if rss := d.Status("VmRSS"); rss > last+1024 || rss < last-1024 {
			at, last = time.Now(), rss
		}
	}
	return at, nil
}

// synced says whether corrald's /metrics reports its machine counts synced.
func synced(d *benchd.Daemon) bool {
	resp, err := http.Get("http://" + d.Metrics + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return err == nil && strings.Contains(string(b), `corral_state_count_synced{kind="machines"} 1`)
}

type result struct {
	first, total time.Duration
	lines        int
	bytes        int64
	maxRSS       int64 // kB
}

// corral runs the CLI with the data directory's admin.conf and times its
// output: the first row is the first line after a table's header (or the
// first line of JSON).
func corral(bin, dir string, args ...string) (result, error) {
	var r result
	cmd := exec.Command(filepath.Join(bin, "corral"), append([]string{"--config", filepath.Join(dir, "admin.conf"), "--timeout", "10m"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	rd := bufio.NewReaderSize(out, 1<<20)
	for {
		line, err := rd.ReadString('\n')
		if len(line) > 0 {
			r.lines++
			r.bytes += int64(len(line))
			if r.first == 0 && (r.lines == 2 || strings.Contains(strings.Join(args, " "), "json")) {
				r.first = time.Since(t0)
			}
		}
		if err != nil {
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		return r, fmt.Errorf("corral %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	r.total = time.Since(t0)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSS = ru.Maxrss
	}
	return r, nil
}
