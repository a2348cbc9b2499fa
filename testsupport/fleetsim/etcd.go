package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A fleet's store: a three-member etcd cluster of Debian's etcd-server,
// local processes in the run's etcd namespace (one address on the boot
// segment, a client and a peer port per member), as testsupport/etcdtest
// starts one on the host's loopback and corral-lab in the rack's
// namespace. The appliances reach it across the segment's bridge; the
// simulator reads its /health and /metrics from the machines' namespace.

// etcdMembers is the size of a fleet's etcd cluster.
const etcdMembers = 3

// etcdPrefix is the fleet's key prefix (--etcd-prefix).
const etcdPrefix = "/fleetsim"

// etcdMember is one member process.
type etcdMember struct {
	name, clientURL, peerURL, dir, log string
	cmd                                *exec.Cmd
	pid                                int
	exited                             chan struct{}
	start                              procStat
	wait0                              time.Duration
}

type etcdCluster struct {
	members []*etcdMember
}

// startEtcd starts the members in topo's etcd namespace, data under dir,
// and waits until each reports healthy.
func startEtcd(ctx context.Context, topo *topology, dir string, timeout time.Duration) (*etcdCluster, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("a fleet needs etcd (apt-get install etcd-server): %w", err)
	}
	c := &etcdCluster{}
	var initial []string
	for i := range etcdMembers {
		port := 2379 + 10000*i // the namespace is the run's own: fixed ports cannot collide
		m := &etcdMember{name: fmt.Sprintf("m%d", i+1),
			clientURL: fmt.Sprintf("http://%s:%d", topo.etcd.addr, port),
			peerURL:   fmt.Sprintf("http://%s:%d", topo.etcd.addr, port+1),
			dir:       filepath.Join(dir, fmt.Sprintf("m%d", i+1)), exited: make(chan struct{})}
		m.log = m.dir + ".log"
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, m := range c.members {
		logf, err := os.Create(m.log)
		if err != nil {
			c.stop()
			return nil, err
		}
		m.cmd = exec.Command("ip", "netns", "exec", topo.etcd.ns, bin,
			"--name", m.name, "--data-dir", m.dir,
			"--listen-client-urls", m.clientURL, "--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "corral-sim-"+topo.id,
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn")
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := m.cmd.Start(); err != nil {
			logf.Close()
			c.stop()
			return nil, fmt.Errorf("start etcd %s: %w", m.name, err)
		}
		m.pid = m.cmd.Process.Pid // ip netns exec execs etcd in place
		go func() {
			_ = m.cmd.Wait() // the exit status says only how it was stopped
			logf.Close()
			close(m.exited)
		}()
	}
	hc := topo.httpClient(relayAddr, 2*time.Second)
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for _, m := range c.members {
		for {
			err := etcdHealthy(ctx, hc, m.clientURL)
			if err == nil {
				break
			}
			select {
			case <-m.exited:
				c.stop()
				return nil, fmt.Errorf("etcd %s exited: %s", m.name, tail(m.log, 10))
			case <-ctx.Done():
				c.stop()
				return nil, ctx.Err()
			default:
			}
			if time.Now().After(deadline) {
				c.stop()
				return nil, fmt.Errorf("etcd %s not healthy within %s: %v", m.name, timeout, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, m := range c.members {
		m.start, _ = readProc(m.pid)
		m.wait0 = runQueueWait(m.pid)
	}
	return c, nil
}

// endpoints is --etcd-endpoints.
func (c *etcdCluster) endpoints() string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.clientURL)
	}
	return strings.Join(out, ",")
}

// stop ends the members (SIGTERM, then SIGKILL after 10 s).
func (c *etcdCluster) stop() {
	for _, m := range c.members {
		if m.cmd == nil || m.cmd.Process == nil {
			continue
		}
		select {
		case <-m.exited:
			continue
		default:
		}
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, m := range c.members {
		if m.cmd == nil || m.cmd.Process == nil {
			continue
		}
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
}

// etcdHealthy asks a member's /health (true once the cluster has a leader).
func etcdHealthy(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&h); err != nil {
		return fmt.Errorf("%s/health: %w", url, err)
	}
	if h.Health != "true" {
		return fmt.Errorf("%s/health: %q", url, h.Health)
	}
	return nil
}

// httpClient is an HTTP client dialling from the machines' namespace
// with source address from.
func (t *topology) httpClient(from netip.Addr, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return t.client.dial(ctx, from, addr)
	}}}
}
