// Package lab runs a real Corral appliance and one real hypervisor node
// for end-to-end tests and benchmarks: corrald in-process (cmd/corrald/server:
// bbolt, TLS, tokens, the BlockStorage/VirtualMachine/Image services and
// their reconciler) on the host end of a veth pair, and the built
// `corral-node hypervisor` binary inside a network namespace created for
// the run, enrolled with a ROLE_NODE token from the appliance's token
// store. QEMU runs under the node, in the namespace, with TCG. Everything
// the lab creates (namespace, veth, processes) is removed by Cleanup.
package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/clientconfig"
	"github.com/corralhq/corral/cmd/corrald/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// T is what the lab needs from a test (testing.TB satisfies it; the
// benchmark program has its own).
type T interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// NodeName is the node name n0stack's usecase files ask for.
const NodeName = "vm-host1"

// NodePort is where the node's HypervisorService listens in the namespace.
const NodePort = 20181

// Tools lists the host programs a lab needs.
var Tools = []string{"ip", "qemu-system-x86_64", "qemu-img", "go"}

// Skip returns why a lab cannot run here ("" when it can).
func Skip() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, taps)"
	}
	for _, b := range Tools {
		if _, err := exec.LookPath(b); err != nil {
			return b + " not installed"
		}
	}
	return ""
}

// Binaries are the built corral-node and corral programs.
type Binaries struct{ Dir string }

func (b Binaries) Node() string   { return filepath.Join(b.Dir, "corral-node") }
func (b Binaries) Corral() string { return filepath.Join(b.Dir, "corral") }

// Build compiles corral-node and corral into dir (with the race detector
// when race is set).
func Build(dir string, race bool) (Binaries, error) {
	args := []string{"build"}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "-o", dir+"/", "github.com/corralhq/corral/cmd/corral-node", "github.com/corralhq/corral/cmd/corral")
	cmd := exec.Command("go", args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return Binaries{}, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, buf.String())
	}
	return Binaries{Dir: dir}, nil
}

// Lab is one appliance and one node.
type Lab struct {
	t      T
	Bin    Binaries
	NS     string // network namespace name
	Veth   string // host end
	HostIP string // appliance side of the veth
	NodeIP string // node side (in NS)
	Dir    string // scratch directory

	Server    *server.Server
	AdminConf string // admin.conf path (for the corral CLI)
	Admin     *clientconfig.Config
	Conn      *grpc.ClientConn // admin connection to corrald
	NodeDir   string           // corral-node --data-dir
	NodeToken string
	CACert    string // CA certificate file

	node    *exec.Cmd
	nodeLog string
	web     *http.Server
	WebURL  string // http://HostIP:port/ serving Files
	Files   map[string]string
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Options tune New.
type Options struct {
	// Files are served over HTTP from the host side (name → path).
	Files map[string]string
	// ServerLog receives corrald's log (default: a file in the lab dir).
	ServerLog *slog.Logger
}

// New creates the namespace and veth, starts corrald and the node, and
// waits until the Node is READY.
func New(t T, bin Binaries, opt Options) *Lab {
	t.Helper()
	id := randHex(3)
	octet := 0
	for _, c := range []byte(id[:2]) {
		octet = octet*16 + int(hexVal(c))
	}
	l := &Lab{t: t, Bin: bin, NS: "crl-e2e-" + id, Veth: "crlh" + id, Dir: t.TempDir(),
		HostIP: fmt.Sprintf("10.231.%d.1", octet), NodeIP: fmt.Sprintf("10.231.%d.2", octet), Files: opt.Files}
	if err := run("ip", "netns", "add", l.NS); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(l.cleanup)
	peer := "crln" + id
	for _, c := range [][]string{
		{"link", "add", l.Veth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", l.NS},
		{"addr", "add", l.HostIP + "/24", "dev", l.Veth},
		{"link", "set", l.Veth, "up"},
		{"-n", l.NS, "link", "set", peer, "name", "uplink0"},
		{"-n", l.NS, "addr", "add", l.NodeIP + "/24", "dev", "uplink0"},
		{"-n", l.NS, "link", "set", "uplink0", "up"},
		{"-n", l.NS, "link", "set", "lo", "up"},
	} {
		if err := run("ip", c...); err != nil {
			t.Fatalf("%v", err)
		}
	}

	// corrald in-process on the host end of the veth.
	log := opt.ServerLog
	if log == nil {
		f, err := os.Create(filepath.Join(l.Dir, "corrald.log"))
		if err != nil {
			t.Fatalf("%v", err)
		}
		t.Cleanup(func() { f.Close() })
		log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	dataDir := filepath.Join(l.Dir, "corrald")
	srv, err := server.New(server.Config{DataDir: dataDir, APIListen: net.JoinHostPort(l.HostIP, "0"), Logger: log})
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	l.Server = srv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("corrald Run: %v", err)
		}
	})
	l.AdminConf = filepath.Join(dataDir, server.AdminConfigFile)
	l.Admin, err = clientconfig.Load(l.AdminConf)
	if err != nil {
		t.Fatalf("admin.conf: %v", err)
	}
	l.Conn, err = clientconfig.Dial(l.Admin)
	if err != nil {
		t.Fatalf("dial corrald: %v", err)
	}
	t.Cleanup(func() { l.Conn.Close() })
	l.CACert = filepath.Join(l.Dir, "ca.pem")
	if err := os.WriteFile(l.CACert, srv.CA().CertPEM(), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	l.NodeToken, err = srv.Tokens().Create(context.Background(), authv1.Role_ROLE_NODE, "e2e node "+id, 0)
	if err != nil {
		t.Fatalf("node token: %v", err)
	}
	if len(l.Files) > 0 {
		l.serveFiles()
	}
	l.NodeDir = filepath.Join(l.Dir, "node")
	l.nodeLog = filepath.Join(l.Dir, "corral-node.log")
	l.StartNode()
	if err := l.WaitNodeReady(time.Minute, time.Time{}); err != nil {
		t.Fatalf("%v\n%s", err, l.NodeLogTail(3000))
	}
	return l
}

func hexVal(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

func (l *Lab) serveFiles() {
	lis, err := net.Listen("tcp", net.JoinHostPort(l.HostIP, "0"))
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p, ok := l.Files[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, p)
	})
	l.web = &http.Server{Handler: mux}
	go l.web.Serve(lis)
	l.WebURL = "http://" + lis.Addr().String() + "/"
}

// StartNode starts `corral-node hypervisor` in the namespace (enrolling
// with the token on first start).
func (l *Lab) StartNode() {
	l.t.Helper()
	f, err := os.OpenFile(l.nodeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", "netns", "exec", l.NS, l.Bin.Node(), "hypervisor",
		"--name", NodeName, "--join", net.JoinHostPort(l.HostIP, strconv.Itoa(addrPort(l.Server.Addr()))),
		"--token", l.NodeToken, "--ca-cert", l.CACert, "--data-dir", l.NodeDir,
		"--listen", net.JoinHostPort(l.NodeIP, strconv.Itoa(NodePort)), "--advertise", l.NodeIP, "--accel", "tcg", "-v")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		l.t.Fatalf("start corral-node: %v", err)
	}
	go func() { cmd.Wait(); f.Close() }()
	l.node = cmd
}

// NodePID is the running corral-node's pid (ip netns exec execs it).
func (l *Lab) NodePID() int {
	if l.node == nil || l.node.Process == nil {
		return 0
	}
	return l.node.Process.Pid
}

// KillNode SIGKILLs corral-node (QEMU, daemonized, keeps running).
func (l *Lab) KillNode() {
	if l.node == nil {
		return
	}
	l.node.Process.Signal(syscall.SIGKILL)
	for i := 0; i < 100; i++ {
		if l.node.ProcessState != nil || syscall.Kill(l.node.Process.Pid, 0) != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.node = nil
}

func addrPort(a net.Addr) int {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.Port
	}
	return 0
}

// Pool is a NodeService client on the admin connection.
func (l *Lab) Pool() poolv1.NodeServiceClient { return poolv1.NewNodeServiceClient(l.Conn) }

// WaitNodeReady waits for the Node to be READY with a heartbeat after
// since.
func (l *Lab) WaitNodeReady(timeout time.Duration, since time.Time) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := l.Pool().GetNode(ctx, &poolv1.GetNodeRequest{Name: NodeName})
		cancel()
		if err == nil && n.GetState() == poolv1.Node_READY && !n.GetLastHeartbeat().AsTime().Before(since) {
			return nil
		}
		last = fmt.Sprint(n.GetState(), err)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("node %s not READY within %v (last: %s)", NodeName, timeout, last)
}

// NodeLogTail is the end of corral-node's log.
func (l *Lab) NodeLogTail(n int) string { return tailFile(l.nodeLog, n) }

// ServerLogTail is the end of corrald's log (when New wrote it).
func (l *Lab) ServerLogTail(n int) string { return tailFile(filepath.Join(l.Dir, "corrald.log"), n) }

func tailFile(p string, n int) string {
	b, _ := os.ReadFile(p)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Do runs `corral do` on a DAG (YAML text) and returns its output.
func (l *Lab) Do(name, dag string, parallel int) (string, time.Duration, error) {
	p := filepath.Join(l.Dir, name)
	if err := os.WriteFile(p, []byte(dag), 0o644); err != nil {
		return "", 0, err
	}
	start := time.Now()
	cmd := exec.Command(l.Bin.Corral(), "--config", l.AdminConf, "do", "--parallel", strconv.Itoa(parallel), "--quiet", p)
	cmd.Env = append(os.Environ(), "HOME="+l.Dir)
	out, err := cmd.CombinedOutput()
	return string(out), time.Since(start), err
}

// MustDo is Do failing the test on error.
func (l *Lab) MustDo(name, dag string, parallel int) (string, time.Duration) {
	l.t.Helper()
	out, d, err := l.Do(name, dag, parallel)
	if err != nil {
		l.t.Fatalf("corral do %s: %v\n%s\n--- node log:\n%s", name, err, out, l.NodeLogTail(3000))
	}
	return out, d
}

// Hypervisor dials the node's HypervisorService directly, as the
// appliance does (mTLS with a client certificate from the appliance CA).
func (l *Lab) Hypervisor() hypervisorv1.HypervisorServiceClient {
	l.t.Helper()
	certPEM, keyPEM, err := l.Server.CA().IssueClientCert("e2e-test", time.Hour)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	conn, err := grpc.NewClient(net.JoinHostPort(l.NodeIP, strconv.Itoa(NodePort)),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: l.Server.CA().Pool(), MinVersion: tls.VersionTLS12})))
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	l.t.Cleanup(func() { conn.Close() })
	return hypervisorv1.NewHypervisorServiceClient(conn)
}

// Console is the serial console log of a VM on the node.
func (l *Lab) Console(vm string) string {
	b, _ := os.ReadFile(filepath.Join(l.NodeDir, "vms", vm, "console.log"))
	return string(b)
}

// WaitConsole waits until every want string is on vm's console and
// returns how long it waited.
func (l *Lab) WaitConsole(vm string, timeout time.Duration, want ...string) (time.Duration, error) {
	start := time.Now()
	for {
		c := l.Console(vm)
		missing := ""
		for _, w := range want {
			if !strings.Contains(c, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("console of %s lacks %q after %v; console tail:\n%s", vm, missing, timeout, tailString(c, 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// QEMUPids lists the pids of QEMU processes whose command line mentions
// the node's data directory (optionally only VM vm's).
func (l *Lab) QEMUPids(vm string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte("qemu-system")) || !bytes.Contains(b, []byte(l.NodeDir+"/")) {
			continue
		}
		if vm != "" && !bytes.Contains(b, []byte("guest=corral:"+vm+"\x00")) && !bytes.Contains(b, []byte("guest=corral:"+vm+",")) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// Links lists the link names in the namespace.
func (l *Lab) Links() ([]string, error) {
	out, err := exec.Command("ip", "-n", l.NS, "-o", "link", "show").Output()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			names = append(names, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	return names, nil
}

// InNS runs a command in the namespace.
func (l *Lab) InNS(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.NS, name}, args...)...).CombinedOutput()
	return string(out), err
}

// WaitPing pings addr from the namespace until it answers.
func (l *Lab) WaitPing(addr string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var out string
	var err error
	for time.Since(start) < timeout {
		out, err = l.InNS(5*time.Second, "ping", "-c", "1", "-W", "1", addr)
		if err == nil {
			return time.Since(start), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start), fmt.Errorf("ping %s from %s: %v: %s", addr, l.NS, err, out)
}

func (l *Lab) cleanup() {
	l.KillNode()
	if l.web != nil {
		l.web.Close()
	}
	// QEMU is daemonized: kill what the node started.
	for i := 0; i < 50; i++ {
		pids := l.QEMUPids("")
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	run("ip", "link", "del", l.Veth)
	if err := run("ip", "netns", "del", l.NS); err != nil {
		l.t.Logf("cleanup: %v", err)
	}
}

// ErrNotReady is returned by helpers when the node went away.
var ErrNotReady = errors.New("node not ready")
