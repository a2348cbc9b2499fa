package fleetsim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// profile records corrald's CPU with perf for d, starting after delay
// (mid-storm), into dir/perf.data; wait returns the hottest functions
// (inclusive time, Corral's, gRPC's, bbolt's, TLS and GC) as report lines,
// or a note why there are none.
type profile struct {
	done  chan struct{}
	lines []string
	note  string
}

func startProfile(ctx context.Context, pid int, dir string, delay, d time.Duration) *profile {
	p := &profile{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if _, err := exec.LookPath("perf"); err != nil {
			p.note = "perf not installed: no CPU profile"
			return
		}
		if !sleepCtx(ctx, delay) {
			return
		}
		data := filepath.Join(dir, "perf.data")
		rec := exec.CommandContext(ctx, "perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(pid), "-o", data, "--", "sleep", strconv.Itoa(int(d.Seconds())))
		if out, err := rec.CombinedOutput(); err != nil {
			p.note = fmt.Sprintf("perf record: %v: %s", err, bytes.TrimSpace(out))
			return
		}
		out, err := exec.CommandContext(ctx, "perf", "report", "-i", data, "--children", "--sort", "symbol", "--stdio", "-g", "none").Output()
		if err != nil {
			p.note = fmt.Sprintf("perf report: %v", err)
			return
		}
		p.lines = hotFunctions(out, 25)
		p.note = fmt.Sprintf("perf record -g of corrald for %s from %s into the storm (%s); inclusive CPU share:", d, delay, data)
	}()
	return p
}

// hotFunctions picks from perf report's children view the n first lines
// naming Corral's code, gRPC's server, bbolt, TLS handshakes or the GC.
func hotFunctions(out []byte, n int) []string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() && len(lines) < n {
		l := sc.Text()
		if strings.HasPrefix(l, "#") || !strings.Contains(l, "%") {
			continue
		}
		// "  10.30%   0.02%  [.] github.com/...Unmarshal   -   -"
		f := strings.Fields(l)
		if len(f) < 4 || (f[2] != "[.]" && f[2] != "[k]") {
			continue
		}
		sym := f[3]
		switch {
		case strings.Contains(sym, "corralhq/corral/") && !strings.Contains(sym, ".gowrap") && !strings.HasSuffix(sym, "-fm"),
			strings.Contains(sym, "bbolt.(*DB).Update"), strings.Contains(sym, "tls.(*Conn).serverHandshake"),
			sym == "runtime.gcBgMarkWorker", strings.Contains(sym, "grpc.(*Server).processUnaryRPC"):
			lines = append(lines, fmt.Sprintf("%7s  %s", f[0], strings.TrimPrefix(sym, "github.com/corralhq/corral/")))
		}
	}
	return lines
}

func (p *profile) wait() ([]string, string) {
	<-p.done
	return p.lines, p.note
}
