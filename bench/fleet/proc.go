package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"google.golang.org/grpc"
)

// Log lines the benchmark waits for or times (their msg text in corrald's
// log).
const (
	lineServing    = "serving gRPC API"
	lineLeading    = "leading the fleet"
	lineRedispatch = "re-dispatched a runner's machines"
)

var watched = []string{lineServing, lineLeading, lineRedispatch}

// maxEvents bounds the occurrences of one watched line kept per process.
const maxEvents = 256

// corrald is one appliance: the built binary run as `corrald serve` on its
// own data directory and API address, restartable on both (a restart is
// the same appliance). Its output goes to LOGDIR/<name>.log and is scanned
// for the watched lines, each timed when read.
type corrald struct {
	bin, name, dataDir, addr, logPath string
	// args are extra `corrald serve` flags (store, etcd, lease TTL).
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	events map[string]*events
	tail   []string // the last lines, for error messages
}

// events are the occurrences of one watched line in the current process.
type events struct {
	n       int // all occurrences, including those dropped below
	dropped int
	at      []time.Time
	lines   []string
}

func newCorrald(bin, root, name string, args ...string) (*corrald, error) {
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &corrald{bin: bin, name: name, dataDir: dir, addr: addr, logPath: filepath.Join(root, name+".log"), args: args}, nil
}

// freeAddr picks a free loopback TCP address (released for corrald to bind).
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start runs corrald and waits until it serves its API (the "serving gRPC
// API" line), at most timeout.
func (c *corrald) start(timeout time.Duration) error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return fmt.Errorf("%s already running", c.name)
	}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "=== bench: start %s\n", time.Now().Format(time.RFC3339Nano))
	args := append([]string{"serve", "--data-dir", c.dataDir, "--api-listen", c.addr, "--appliance-name", c.name,
		// 32 clients on one appliance plus its peer's connections: above
		// the default of 32 connections from one address.
		"--grpc-max-conns-per-ip", "256"}, c.args...)
	cmd := exec.Command(c.bin, args...)
	cmd.Env = cleanEnv()
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		c.mu.Unlock()
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	// Killed with the benchmark, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logf.Close()
		c.mu.Unlock()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	pw.Close()
	c.cmd, c.exited = cmd, make(chan struct{})
	c.events = map[string]*events{}
	for _, w := range watched {
		c.events[w] = &events{}
	}
	exited := c.exited
	scanned := make(chan struct{})
	c.mu.Unlock()
	go func() {
		defer close(scanned)
		defer logf.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			now := time.Now()
			line := sc.Text()
			fmt.Fprintln(logf, line)
			c.note(now, line)
		}
		pr.Close()
	}()
	go func() {
		_ = cmd.Wait() // killed or stopped by the bench: its log says how it ended
		<-scanned
		close(exited)
	}()
	if _, _, err := c.waitLine(lineServing, 0, timeout); err != nil {
		c.kill()
		return err
	}
	return nil
}

// cleanEnv is this process's environment without CORRAL_* variables, so
// that only the benchmark's flags configure corrald.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CORRAL_") {
			env = append(env, kv)
		}
	}
	return env
}

func (c *corrald) note(at time.Time, line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tail) >= 30 {
		c.tail = c.tail[1:]
	}
	c.tail = append(c.tail, line)
	for _, w := range watched {
		if !strings.Contains(line, w) {
			continue
		}
		e := c.events[w]
		e.n++
		if len(e.at) >= maxEvents {
			e.at, e.lines = e.at[1:], e.lines[1:]
			e.dropped++
		}
		e.at = append(e.at, at)
		e.lines = append(e.lines, line)
	}
}

// count is how many times the current process has logged line.
func (c *corrald) count(line string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.events == nil {
		return 0
	}
	return c.events[line].n
}

// waitLine waits until the current process has logged line more than
// after times and returns when the next occurrence was read, and the line.
func (c *corrald) waitLine(line string, after int, timeout time.Duration) (time.Time, string, error) {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		e, exited := c.events[line], c.exited
		if e != nil && e.n > after && after >= e.dropped {
			at, text := e.at[after-e.dropped], e.lines[after-e.dropped]
			c.mu.Unlock()
			return at, text, nil
		}
		c.mu.Unlock()
		select {
		case <-exited:
			return time.Time{}, "", fmt.Errorf("%s exited before logging %q:\n%s", c.name, line, c.lastLines())
		default:
		}
		if time.Now().After(deadline) {
			return time.Time{}, "", fmt.Errorf("%s: no %q within %v:\n%s", c.name, line, timeout, c.lastLines())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *corrald) lastLines() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tail, "\n")
}

// kill sends SIGKILL (kill -9) and waits until the process is reaped. It
// returns when the signal was sent.
func (c *corrald) kill() time.Time {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return time.Now()
	}
	at := time.Now()
	_ = cmd.Process.Signal(syscall.SIGKILL) // fails only once it has exited, which is the goal
	<-exited
	return at
}

// stop asks corrald to stop (SIGTERM) and kills it after 15 s.
func (c *corrald) stop() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	// A signal fails only once it has exited, which is the goal.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

// copyClusterKey gives c the cluster key of the fleet's first appliance,
// as an operator does before starting the next one.
func (c *corrald) copyClusterKey(from *corrald) error {
	key, err := os.ReadFile(filepath.Join(from.dataDir, "cluster.key"))
	if err != nil {
		return fmt.Errorf("cluster key of %s: %w", from.name, err)
	}
	return os.WriteFile(filepath.Join(c.dataDir, "cluster.key"), key, 0o600)
}

// startFleet starts appliances on one etcd prefix one after the other, the
// first on an empty prefix (it writes the cluster key and admin.conf), the
// others with its cluster key. It returns the admin client config.
func startFleet(apps []*corrald) (*clientconfig.Config, error) {
	for i, a := range apps {
		if i > 0 {
			if err := a.copyClusterKey(apps[0]); err != nil {
				return nil, err
			}
		}
		if err := a.start(60 * time.Second); err != nil {
			return nil, err
		}
	}
	return clientconfig.Load(filepath.Join(apps[0].dataDir, "admin.conf"))
}

// dial connects to addr as the admin of cc (TLS, bearer token).
func dial(cc *clientconfig.Config, addr string) (*grpc.ClientConn, error) {
	c := *cc
	c.Endpoint = addr
	return clientconfig.Dial(&c)
}
