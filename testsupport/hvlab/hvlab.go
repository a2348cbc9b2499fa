// Package hvlab runs a real Corral appliance and one real hypervisor node
// for end-to-end tests and benchmarks: corrald in-process (appliance:
// bbolt, TLS, tokens, the BlockStorage/VirtualMachine/Image services and
// their reconciler) on the host end of a veth pair, and the built
// `corral-node hypervisor` binary inside a network namespace created for
// the run, each node enrolled with its own single-use ROLE_NODE token from
// the appliance's token store. QEMU runs under the node, in the namespace, with TCG. Everything
// the lab creates (namespace, veth, processes) is removed by Cleanup.
package hvlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
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
	"github.com/corralhq/corral/api/clientconfig"
	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	apptest "github.com/corralhq/corral/testsupport/appliance"
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
var Tools = []string{"ip", "qemu-system-x86_64", "qemu-img", "go", "ping"}

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

// Node is the corral-node program's path.
func (b Binaries) Node() string { return filepath.Join(b.Dir, "corral-node") }

// Corral is the corral program's path.
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

// Lab is one appliance and its nodes. The first node (NodeName) is
// embedded: l.NS, l.NodeDir, l.StartNode() ... are its.
type Lab struct {
	*Node
	t      T
	Bin    Binaries
	ID     string
	Bridge string // host bridge joining the appliance and the nodes' veths
	HostIP string // appliance address on Bridge
	Dir    string // scratch directory
	subnet int

	Server    *appliance.Server
	AdminConf string // admin.conf path (for the corral CLI)
	Admin     *clientconfig.Config
	Conn      *grpc.ClientConn // admin connection to corrald
	CACert    string           // CA certificate file
	Nodes     []*Node

	web    *http.Server
	WebURL string // http://HostIP:port/ serving Files
	Files  map[string]string
}

// Node is one `corral-node hypervisor` in its own network namespace,
// reached over a veth on the lab's host bridge.
type Node struct {
	lab     *Lab
	Name    string
	NS      string // network namespace
	Veth    string // host end
	NodeIP  string // node address (in NS, on uplink0)
	NodeDir string // corral-node --data-dir
	cmd     *exec.Cmd
	nodeLog string
	token   string // its single-use node token, bound to Name
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ipCmd runs ip(8) with args; its error quotes the command and its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
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
	l := &Lab{t: t, Bin: bin, ID: id, Bridge: "crlb" + id, Dir: t.TempDir(), Files: opt.Files,
		subnet: int(hexVal(id[0]))*16 + int(hexVal(id[1]))}
	l.HostIP = fmt.Sprintf("10.231.%d.1", l.subnet)
	t.Cleanup(l.cleanup)
	for _, c := range [][]string{
		{"link", "add", l.Bridge, "type", "bridge"},
		{"addr", "add", l.HostIP + "/24", "dev", l.Bridge},
		{"link", "set", l.Bridge, "up"},
	} {
		if err := ipCmd(c...); err != nil {
			t.Fatalf("%v", err)
		}
	}

	// corrald in-process on the host bridge.
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
	a := apptest.Start(t, appliance.Config{DataDir: dataDir, APIListen: net.JoinHostPort(l.HostIP, "0"), Logger: log}, apptest.RunErrorLogged())
	l.Server = a.Server
	l.AdminConf = a.AdminConf
	var err error
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
	if err := os.WriteFile(l.CACert, a.Server.CA().CertPEM(), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	if len(l.Files) > 0 {
		l.serveFiles()
	}
	l.Node = l.AddNode(NodeName)
	return l
}

// AddNode creates a namespace with a veth on the host bridge, starts
// `corral-node hypervisor --name name` in it and waits for READY.
func (l *Lab) AddNode(name string) *Node {
	t := l.t
	t.Helper()
	i := len(l.Nodes)
	n := &Node{lab: l, Name: name, NS: fmt.Sprintf("crl-e2e-%s-%d", l.ID, i), Veth: fmt.Sprintf("crlh%s%d", l.ID, i),
		NodeIP: fmt.Sprintf("10.231.%d.%d", l.subnet, 2+i)}
	n.NodeDir = filepath.Join(l.Dir, "node-"+name)
	n.nodeLog = filepath.Join(l.Dir, "corral-node-"+name+".log")
	if err := ipCmd("netns", "add", n.NS); err != nil {
		t.Fatalf("%v", err)
	}
	l.Nodes = append(l.Nodes, n)
	peer := fmt.Sprintf("crln%s%d", l.ID, i)
	for _, c := range [][]string{
		{"link", "add", n.Veth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", n.NS},
		{"link", "set", n.Veth, "master", l.Bridge},
		{"link", "set", n.Veth, "up"},
		{"-n", n.NS, "link", "set", peer, "name", "uplink0"},
		{"-n", n.NS, "addr", "add", n.NodeIP + "/24", "dev", "uplink0"},
		{"-n", n.NS, "link", "set", "uplink0", "up"},
		{"-n", n.NS, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(c...); err != nil {
			t.Fatalf("%v", err)
		}
	}
	n.StartNode()
	if err := n.WaitNodeReady(time.Minute, time.Time{}); err != nil {
		t.Fatalf("%v\n%s", err, n.NodeLogTail(3000))
	}
	return n
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
	// Serve ends with ErrServerClosed when the cleanup closes it; a file
	// it failed to serve shows as the guest's failure.
	go func() { _ = l.web.Serve(lis) }()
	l.WebURL = "http://" + lis.Addr().String() + "/"
}

// StartNode starts `corral-node hypervisor` in the namespace (enrolling
// with the token on first start).
func (n *Node) StartNode() {
	l := n.lab
	l.t.Helper()
	f, err := os.OpenFile(n.nodeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	if n.token == "" {
		// Node tokens are single-use: one per node, bound to its name.
		n.token, _, err = l.Server.Tokens().CreateBound(context.Background(), auth.TokenSpec{
			Role: authv1.Role_ROLE_NODE, Description: "e2e node " + n.Name, Node: n.Name})
		if err != nil {
			f.Close()
			l.t.Fatalf("node token: %v", err)
		}
	}
	cmd := exec.Command("ip", "netns", "exec", n.NS, l.Bin.Node(), "hypervisor",
		"--name", n.Name, "--join", net.JoinHostPort(l.HostIP, strconv.Itoa(addrPort(l.Server.Addr()))),
		"--token", n.token, "--ca-cert", l.CACert, "--data-dir", n.NodeDir,
		"--listen", net.JoinHostPort(n.NodeIP, strconv.Itoa(NodePort)), "--advertise", n.NodeIP, "--accel", "tcg", "-v")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		l.t.Fatalf("start corral-node: %v", err)
	}
	go func() {
		_ = cmd.Wait() // killed or stopped by the test: the log says how it went
		f.Close()
	}()
	n.cmd = cmd
}

// NodePID is the running corral-node's pid (ip netns exec execs it).
func (n *Node) NodePID() int {
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// KillNode SIGKILLs corral-node (QEMU, daemonized, keeps running).
func (n *Node) KillNode() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL) // gone already is fine: the loop waits for gone
	for i := 0; i < 100; i++ {
		if syscall.Kill(n.cmd.Process.Pid, 0) != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.cmd = nil
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
func (n *Node) WaitNodeReady(timeout time.Duration, since time.Time) error {
	l := n.lab
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := l.Pool().GetNode(ctx, &poolv1.GetNodeRequest{Name: n.Name})
		cancel()
		if err == nil && got.GetState() == poolv1.Node_READY && !got.GetLastHeartbeat().AsTime().Before(since) {
			return nil
		}
		last = fmt.Sprint(got.GetState(), err)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("node %s not READY within %v (last: %s)", n.Name, timeout, last)
}

// NodeLogTail is the end of corral-node's log.
func (n *Node) NodeLogTail(size int) string { return tailFile(n.nodeLog, size) }

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
func (n *Node) Hypervisor() hypervisorv1.HypervisorServiceClient {
	l := n.lab
	l.t.Helper()
	certPEM, keyPEM, err := l.Server.CA().IssueClientCert("e2e-test", time.Hour)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	conn, err := grpc.NewClient(net.JoinHostPort(n.NodeIP, strconv.Itoa(NodePort)),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: l.Server.CA().Pool(),
			ServerName: n.Name, MinVersion: tls.VersionTLS12}))) // node certificates name the node only
	if err != nil {
		l.t.Fatalf("%v", err)
	}
	l.t.Cleanup(func() { conn.Close() })
	return hypervisorv1.NewHypervisorServiceClient(conn)
}

// Console is the serial console log of a VM on the node.
func (n *Node) Console(vm string) string {
	b, _ := os.ReadFile(filepath.Join(n.NodeDir, "vms", vm, "console.log"))
	return string(b)
}

// WaitConsole waits until every want string is on vm's console and
// returns how long it waited.
func (n *Node) WaitConsole(vm string, timeout time.Duration, want ...string) (time.Duration, error) {
	start := time.Now()
	for {
		c := n.Console(vm)
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
func (n *Node) QEMUPids(vm string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte("qemu-system")) || !bytes.Contains(b, []byte(n.NodeDir+"/")) {
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
func (n *Node) Links() ([]string, error) {
	out, err := exec.Command("ip", "-n", n.NS, "-o", "link", "show").Output()
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
func (n *Node) InNS(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS, name}, args...)...).CombinedOutput()
	return string(out), err
}

// WaitPing pings addr from the namespace until it answers.
func (n *Node) WaitPing(addr string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var out string
	var err error
	for time.Since(start) < timeout {
		out, err = n.InNS(5*time.Second, "ping", "-c", "1", "-W", "1", addr)
		if err == nil {
			return time.Since(start), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start), fmt.Errorf("ping %s from %s: %v: %s", addr, n.NS, err, out)
}

func (l *Lab) cleanup() {
	for _, n := range l.Nodes {
		n.KillNode()
	}
	if l.web != nil {
		l.web.Close()
	}
	for _, n := range l.Nodes {
		// QEMU is daemonized: kill what the node started.
		for i := 0; i < 50; i++ {
			pids := n.QEMUPids("")
			if len(pids) == 0 {
				break
			}
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL) // the loop looks again
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := ipCmd("link", "del", n.Veth); err != nil {
			l.t.Logf("cleanup: %v", err)
		}
		if err := ipCmd("netns", "del", n.NS); err != nil {
			l.t.Logf("cleanup: %v", err)
		}
	}
	if err := ipCmd("link", "del", l.Bridge); err != nil {
		l.t.Logf("cleanup: %v", err)
	}
}
