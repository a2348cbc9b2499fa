// Package etcdtest starts a real etcd cluster for tests, benchmarks and the
// virtual rack: member processes of Debian's etcd-server on loopback ports,
// each with its own data directory. Members can be killed (SIGKILL) and
// started again on the same ports and data, to test quorum loss and return.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/corralhq/corral/testsupport/require"
)

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	Dir       string
	LogFile   string

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed when the current process has been reaped.
	exited chan struct{}
}

// Cluster is a set of members forming one etcd cluster.
type Cluster struct {
	Members []*Member
	initial string
	token   string
	binary  string
}

// Start starts an n-member cluster in dir and waits until it answers. The
// caller stops it with Stop.
func Start(dir string, n int) (*Cluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd not installed (apt-get install etcd-server): %w", err)
	}
	c := &Cluster{binary: bin, token: fmt.Sprintf("corral-test-%d-%d", os.Getpid(), time.Now().UnixNano())}
	var initial []string
	for i := range n {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		m := &Member{
			Name:      fmt.Sprintf("m%d", i+1),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
			Dir:       filepath.Join(dir, fmt.Sprintf("m%d", i+1)),
		}
		m.LogFile = m.Dir + ".log"
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	c.initial = strings.Join(initial, ",")
	for i := range c.Members {
		if err := c.StartMember(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// New starts an n-member cluster for t in a temporary directory and stops it
// when t ends. It skips (or fails under CI) when etcd is not installed.
func New(t testing.TB, n int) *Cluster {
	t.Helper()
	require.Tool(t, "etcd")
	c, err := Start(t.TempDir(), n)
	if err != nil {
		t.Fatalf("etcd cluster: %v", err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, m := range c.Members {
				if b, err := os.ReadFile(m.LogFile); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("etcd %s log (last lines):\n%s", m.Name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
				}
			}
		}
	})
	return c
}

// freePorts reserves n loopback ports and releases them for the member.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// EndpointsFlag is Endpoints joined by commas, as --etcd-endpoints takes them.
func (c *Cluster) EndpointsFlag() string { return strings.Join(c.Endpoints(), ",") }

// StartMember starts member i (again) on its ports and data directory.
func (c *Cluster) StartMember(i int) error {
	m := c.Members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return fmt.Errorf("etcd %s already running", m.Name)
	}
	state := "new"
	if _, err := os.Stat(filepath.Join(m.Dir, "member")); err == nil {
		state = "existing"
	}
	log, err := os.OpenFile(m.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.binary,
		"--name", m.Name,
		"--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL,
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL,
		"--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", c.initial,
		"--initial-cluster-state", state,
		"--initial-cluster-token", c.token,
		// Test clusters: short election timers so a lost leader is
		// replaced in about a second, and no fsync stalls beyond the
		// disk's own.
		"--heartbeat-interval", "100",
		"--election-timeout", "1000",
		"--snapshot-count", "10000",
		"--logger", "zap",
		"--log-outputs", "stderr",
	)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start etcd %s: %w", m.Name, err)
	}
	m.cmd = cmd
	exited := make(chan struct{})
	m.exited = exited
	go func() {
		_ = cmd.Wait() // the exit status says only how the member was stopped
		log.Close()
		close(exited)
	}()
	return nil
}

// Kill sends SIGKILL to member i and waits for it to exit.
func (c *Cluster) Kill(i int) {
	m := c.Members[i]
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill() // fails only when it has exited already, which is the goal
	<-exited
}

// Running reports whether member i's process is alive.
func (c *Cluster) Running(i int) bool {
	m := c.Members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

// Stop kills every member.
func (c *Cluster) Stop() {
	for i := range c.Members {
		c.Kill(i)
	}
}

// WaitHealthy waits until a write commits through the cluster (a quorum
// exists and has a leader).
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	var live []string
	for i, m := range c.Members {
		if c.Running(i) {
			live = append(live, m.ClientURL)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: live, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, last = cli.Put(ctx, "/etcdtest/health", time.Now().String())
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("etcd cluster %s not healthy after %s: %v", strings.Join(live, ","), timeout, last)
}
