package fleetsim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// appliance is a corrald process under test, in its namespace.
type appliance struct {
	name    string     // in a fleet
	addr    netip.Addr // on the segment
	ns      string
	cmd     *exec.Cmd
	pid     int
	wait0   time.Duration // its threads' run-queue wait when ready
	dataDir string
	logPath string
	exited  chan struct{}
	waitErr error
	start   procStat
}

// procStat is what /proc says about a process's CPU and memory.
type procStat struct {
	ticks   uint64 // utime + stime, clock ticks
	hwmKB   uint64 // VmHWM: peak RSS
	rssKB   uint64 // VmRSS
	threads int
}

const clockTicks = 100 // USER_HZ on Linux

// runQueueWait sums, over pid's threads, the time they were runnable but
// waiting for a CPU (/proc/PID/task/TID/schedstat, second field, ns): on
// a loaded machine that, not the appliance's own work, can be where a
// request waits.
func runQueueWait(pid int) time.Duration {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			total += n
		}
	}
	return time.Duration(total)
}

func readProc(pid int) (procStat, error) {
	var s procStat
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return s, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 15 {
		return s, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	// Fields after ")": state(0) ... utime(11) stime(12).
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	s.ticks = ut + st
	st2, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return s, err
	}
	defer st2.Close()
	sc := bufio.NewScanner(st2)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			s.hwmKB = n
		case "VmRSS":
			s.rssKB = n
		case "Threads":
			s.threads = int(n)
		}
	}
	return s, nil
}

// writeArtifacts writes the stand-in kernel and initramfs files of the
// given sizes (random bytes: nothing compresses them on the wire).
func writeArtifacts(dir string, kernel, initrd, hvInitrd int64) (k, i, h string, err error) {
	write := func(name string, n int64) (string, error) {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return "", err
		}
		defer f.Close()
		if _, err := io.CopyN(f, rand.Reader, n); err != nil {
			return "", err
		}
		return p, f.Close()
	}
	if k, err = write("vmlinuz", kernel); err != nil {
		return
	}
	if i, err = write("initrd.img", initrd); err != nil {
		return
	}
	h, err = write("hypervisor.img", hvInitrd)
	return
}

// applianceSpec is one corrald of a run: its place on the segment, its
// directories, and in a fleet its name and the store's flags.
type applianceSpec struct {
	index   int
	name    string // --appliance-name in a fleet ("" alone)
	port    segPort
	workDir string   // its data dir and log go here
	fleet   []string // --store etcd ... (nil alone)
	dhcp    bool     // serves DHCP and TFTP (always alone)
	// artifacts are the stand-in kernel, initramfs and hypervisor
	// initramfs.
	kernel, initrd, hvInitrd string
	// clusterKey is the fleet's cluster key, written into a joining
	// appliance's data dir (nil: its own, the first's).
	clusterKey []byte
}

// startAppliance starts corrald serve in its namespace with the run's
// flags and waits until /readyz answers (and, alone or as a fleet's
// first, until it has written admin.conf).
func startAppliance(ctx context.Context, cfg *Config, topo *topology, sp applianceSpec) (*appliance, error) {
	a := &appliance{name: sp.name, addr: sp.port.addr, ns: sp.port.ns,
		dataDir: filepath.Join(sp.workDir, "corrald-data"), logPath: filepath.Join(sp.workDir, "corrald.log"), exited: make(chan struct{})}
	// Every storm starts on an empty store: a kept work directory's
	// data from an earlier run goes.
	if err := os.RemoveAll(a.dataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(a.dataDir, 0o700); err != nil {
		return nil, err
	}
	if sp.clusterKey != nil {
		if err := os.WriteFile(filepath.Join(a.dataDir, "cluster.key"), sp.clusterKey, 0o600); err != nil {
			return nil, err
		}
	}
	maxDisc := 2*cfg.Machines + 100
	addr := sp.port.addr
	args := []string{"netns", "exec", sp.port.ns, cfg.Corrald, "serve",
		"--data-dir", a.dataDir,
		"--api-listen", fmt.Sprintf("%s:%d", addr, apiPort),
		"--metrics-listen", fmt.Sprintf("%s:%d", addr, metricsPort),
		"--http-listen", fmt.Sprintf("%s:%d", addr, httpPort),
		"--no-ra",
		"--boot-interface", sp.port.ifname,
	}
	if sp.dhcp {
		args = append(args, "--dhcp-mode", "full",
			"--dhcp-range", fmt.Sprintf("%s-%s", poolStart, poolEnd),
			"--dhcp-relay-range", fmt.Sprintf("%s=%s-%s@%s", relayNet, relayStart, relayEnd, giaddr))
	} else {
		args = append(args, "--dhcp-mode", "off")
	}
	args = append(args,
		"--max-discovered", strconv.Itoa(maxDisc),
		"--auto-accept",
		"--boot-kernel", sp.kernel, "--boot-initrd", sp.initrd, "--boot-hypervisor-initrd", sp.hvInitrd,
		"--log-level", "warn",
	)
	if cfg.NoTFTP || !sp.dhcp {
		args = append(args, "--tftp-listen", "off")
	} else {
		args = append(args, "--tftp-listen", fmt.Sprintf("%s:69", addr))
	}
	if cfg.NodeHeartbeatTimeout > 0 {
		args = append(args, "--node-heartbeat-timeout", cfg.NodeHeartbeatTimeout.String())
	}
	if cfg.NodeSweepInterval > 0 {
		args = append(args, "--node-sweep-interval", cfg.NodeSweepInterval.String())
	}
	if sp.fleet != nil {
		args = append(args, sp.fleet...)
		args = append(args, "--appliance-name", sp.name, "--api-advertise", fmt.Sprintf("%s:%d", addr, apiPort))
	}
	args = append(args, cfg.CorraldArgs...)
	logf, err := os.Create(a.logPath)
	if err != nil {
		return nil, err
	}
	a.cmd = exec.Command("ip", args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start corrald: %w", err)
	}
	// ip netns exec execs corrald in place: same pid.
	a.pid = a.cmd.Process.Pid
	go func() {
		a.waitErr = a.cmd.Wait()
		logf.Close()
		close(a.exited)
	}()
	return a, a.waitReady(ctx, topo, cfg.StartTimeout, sp.index == 0)
}

// waitReady waits until corrald's /readyz answers 200 (and, with admin,
// until it has written admin.conf); it stops corrald when it fails.
func (a *appliance) waitReady(ctx context.Context, topo *topology, timeout time.Duration, admin bool) error {
	hc := topo.httpClient(relayAddr, 2*time.Second)
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-a.exited:
			return fmt.Errorf("corrald %s exited at start (%v): %s", a.label(), a.waitErr, tail(a.logPath, 20))
		case <-ctx.Done():
			a.stop()
			return ctx.Err()
		default:
		}
		resp, err := hc.Get(fmt.Sprintf("http://%s:%d/readyz", a.addr, metricsPort))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if _, err := os.Stat(filepath.Join(a.dataDir, "admin.conf")); err == nil || !admin {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			a.stop()
			return fmt.Errorf("corrald %s not ready within %s: %s", a.label(), timeout, tail(a.logPath, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	a.start, _ = readProc(a.pid)
	a.wait0 = runQueueWait(a.pid)
	return nil
}

// label names the appliance in messages: its fleet name, or its address.
func (a *appliance) label() string {
	if a.name != "" {
		return a.name
	}
	return a.addr.String()
}

// stop ends corrald (SIGTERM, then SIGKILL after 20 s) and waits for it.
func (a *appliance) stop() {
	select {
	case <-a.exited:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
