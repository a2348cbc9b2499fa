// Small helpers of the storm: process and load figures, the open-file
// limit, UDP drops in a namespace, and formatting.

package fleetsim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTicks is the appliances' CPU so far (clock ticks).
func (s *sim) cpuTicks() uint64 {
	var n uint64
	for _, a := range s.apps {
		p, _ := readProc(a.pid)
		n += p.ticks
	}
	return n
}

func procLine(pid int, start procStat, since time.Duration) string {
	p, err := readProc(pid)
	if err != nil {
		return "gone"
	}
	return fmt.Sprintf("cpu %.0f%% rss %d MiB threads %d", 100*float64(p.ticks-start.ticks)/clockTicks/max(since.Seconds(), 0.001),
		p.rssKB>>10, p.threads)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func maps[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// cause shortens an error to its failure-table key: the step and the
// kind, without addresses.
func cause(err error) string {
	s := err.Error()
	for _, k := range []string{"dial tcp", "read tcp", "write tcp"} {
		if i := strings.Index(s, k); i >= 0 {
			// "dial tcp A->B: connect: connection refused": keep the
			// operation and the reason, not the addresses.
			rest := s[i+len(k):]
			if j := strings.LastIndex(rest, ": "); j >= 0 {
				rest = rest[j:]
			} else {
				rest = ""
			}
			s = s[:i] + k + rest
		}
	}
	return clip(s, 80)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
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

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// raiseNoFile raises RLIMIT_NOFILE to n, or as far as the hard limit
// allows when n cannot be had (no CAP_SYS_RESOURCE in a container); it
// returns the soft limit in force.
func raiseNoFile(n uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= n {
		return l.Cur, nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(l.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return n, nil
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("open-file limit: %w", err)
	}
	return l.Cur, nil
}

// udpDrops is the namespace's UDP RcvbufErrors (/proc/net/snmp): DHCP
// packets the kernel dropped because a socket's buffer was full.
func udpDrops(ctx context.Context, ns string) int64 {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return -1
	}
	var head []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				n, _ := strconv.ParseInt(f[i], 10, 64)
				return n
			}
		}
	}
	return -1
}
