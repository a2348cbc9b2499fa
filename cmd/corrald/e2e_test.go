package main

// End-to-end tests: the real corrald binary on a temp data dir and a
// loopback port, driven by grpcurl (a real gRPC client over TLS) and the
// corral CLI. Skipped with -short.

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		flag.Parse()
		if testing.Short() {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "corral-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		build := exec.Command("go", "build", "-race", "-o", dir+"/", "github.com/corralhq/corral/cmd/corrald", "github.com/corralhq/corral/cmd/corral")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build:", err)
			return 1
		}
		binDir = dir
		return m.Run()
	}
	os.Exit(code())
}

func needE2E(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: skipped with -short")
	}
}

// grpcurlPath finds grpcurl on PATH or in the repo's .bin (make tools).
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	p, _ := filepath.Abs("../../.bin/grpcurl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	require.Missing(t, "grpcurl not installed (run `make tools`)")
	return ""
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type daemon struct {
	cmd  *exec.Cmd
	addr string
	// metrics is the --metrics-listen address a test gave ("" = none).
	metrics string
	logs    *syncbuf.Buffer
	exited  chan error
	// waited is closed once Wait has returned (ProcessState is then set;
	// reading it before would race with Wait).
	waited chan struct{}
}

// startCorrald runs `corrald serve` and waits until the API answers.
func startCorrald(t *testing.T, dataDir, addr string, env ...string) *daemon {
	t.Helper()
	d := &daemon{addr: addr, logs: &syncbuf.Buffer{}, exited: make(chan error, 1), waited: make(chan struct{})}
	d.cmd = exec.Command(filepath.Join(binDir, "corrald"), "serve", "--data-dir", dataDir)
	d.cmd.Env = append(append(os.Environ(), "CORRAL_API_LISTEN="+addr), env...)
	pr, pw, _ := os.Pipe()
	d.cmd.Stdout, d.cmd.Stderr = pw, pw
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := false
		for sc.Scan() {
			d.logs.Write([]byte(sc.Text() + "\n"))
			if !once && strings.Contains(sc.Text(), "serving gRPC API") {
				once = true
				close(ready)
			}
		}
	}()
	go func() {
		err := d.cmd.Wait()
		close(d.waited)
		d.exited <- err
	}()
	t.Cleanup(func() {
		select {
		case <-d.waited:
		default:
			d.cmd.Process.Kill()
			<-d.waited
		}
		if t.Failed() {
			t.Logf("corrald logs:\n%s", d.logs.String())
		}
	})
	select {
	case <-ready:
	case err := <-d.exited:
		t.Fatalf("corrald exited early: %v\n%s", err, d.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("corrald did not start\n%s", d.logs.String())
	}
	return d
}

func runCmd(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

type grpcurl struct {
	t      *testing.T
	bin    string
	addr   string
	caFile string
}

func newGrpcurl(t *testing.T, dataDir, addr string) *grpcurl {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, []byte(cc.CACert), 0o644); err != nil {
		t.Fatal(err)
	}
	return &grpcurl{t: t, bin: grpcurlPath(t), addr: addr, caFile: caFile}
}

func (g *grpcurl) call(token, method, data string) (string, error) {
	args := []string{"-cacert", g.caFile}
	if token != "" {
		args = append(args, "-H", "authorization: Bearer "+token)
	}
	if data != "" {
		args = append(args, "-d", data)
	}
	args = append(args, g.addr)
	if method != "" {
		args = append(args, method)
	} else {
		args = append(args, "list")
	}
	return runCmd(g.t, g.bin, args...)
}

func adminToken(t *testing.T, dataDir string) string {
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	return cc.Token
}

func TestE2EGrpcurlTLSAndRoles(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	// A viewer token minted offline before the first start.
	tc := exec.Command(filepath.Join(binDir, "corrald"), "token", "create", "--data-dir", dataDir, "--role", "viewer")
	tc.Stderr = os.Stderr
	stdout, err := tc.Output()
	if err != nil {
		t.Fatalf("token create: %v", err)
	}
	viewer := strings.TrimSpace(string(stdout))
	if !strings.HasPrefix(viewer, "crl_") || strings.Contains(viewer, "\n") {
		t.Fatalf("token create printed %q, want one token", viewer)
	}
	var out string
	addr := freePort(t)
	startCorrald(t, dataDir, addr)
	// No admin.conf was written because a token already existed.
	if _, err := os.Stat(filepath.Join(dataDir, "admin.conf")); err == nil {
		t.Fatal("admin.conf written although tokens existed")
	}
	gv := &grpcurl{t: t, bin: grpcurlPath(t), addr: addr, caFile: filepath.Join(dataDir, "pki", "ca.crt")}
	if out, err := gv.call(viewer, "corral.pool.v1.NodeService/ListNodes", "{}"); err != nil {
		t.Fatalf("viewer ListNodes: %v\n%s", err, out)
	}
	if out, _ := gv.call(viewer, "corral.pool.v1.NodeService/ApplyNode", `{"name":"n1","cpu_milli_cores":1000,"memory_bytes":"1073741824"}`); !strings.Contains(out, "PermissionDenied") {
		t.Errorf("viewer ApplyNode: want PermissionDenied, got %s", out)
	}
	dataDir2 := t.TempDir()
	addr2 := freePort(t)
	startCorrald(t, dataDir2, addr2)
	g := newGrpcurl(t, dataDir2, addr2)
	admin := adminToken(t, dataDir2)

	out, err = g.call(admin, "", "")
	if err != nil {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	for _, svc := range []string{"corral.pool.v1.NodeService", "corral.pool.v1.NetworkService", "corral.provisioning.v1.VirtualMachineService",
		"corral.provisioning.v1.BlockStorageService", "corral.deployment.v1.ImageService", "corral.inventory.v1.MachineService", "corral.node.v1.AgentService"} {
		if !strings.Contains(out, svc) {
			t.Errorf("reflection does not list %s:\n%s", svc, out)
		}
	}
	out, err = g.call(admin, "corral.pool.v1.NodeService/ListNodes", "{}")
	if err != nil || strings.TrimSpace(out) != "{}" {
		t.Fatalf("ListNodes on empty pool: %v %q", err, out)
	}
	out, err = g.call(admin, "corral.pool.v1.NodeService/ApplyNode", `{"name":"n1","cpu_milli_cores":4000,"memory_bytes":"8589934592","rack":"r1"}`)
	if err != nil || !strings.Contains(out, `"READY"`) {
		t.Fatalf("ApplyNode: %v\n%s", err, out)
	}
	out, _ = g.call("", "corral.pool.v1.NodeService/GetNode", `{"name":"n1"}`)
	if !strings.Contains(out, "Unauthenticated") {
		t.Errorf("no token: %s", out)
	}
	// The viewer token belongs to the other data dir: unknown here.
	out, _ = g.call(viewer, "corral.pool.v1.NodeService/GetNode", `{"name":"n1"}`)
	if !strings.Contains(out, "Unauthenticated") {
		t.Errorf("foreign token: %s", out)
	}
	out, err = g.call(admin, "corral.provisioning.v1.VirtualMachineService/ListVirtualMachines", "{}")
	if err != nil || strings.TrimSpace(out) != "{}" {
		t.Errorf("ListVirtualMachines on an empty appliance: %v %s", err, out)
	}
	out, _ = g.call(admin, "corral.inventory.v1.MachineService/AcceptMachine", `{"name":"x"}`)
	if !strings.Contains(out, "NotFound") {
		t.Errorf("AcceptMachine of an unknown machine: %s", out)
	}
	out, _ = g.call(admin, "corral.pool.v1.NetworkService/ApplyNetwork", `{"name":"bad","ipv4_cidr":"10.0.0.5/24"}`)
	if !strings.Contains(out, "InvalidArgument") || !strings.Contains(out, "10.0.0.0/24") {
		t.Errorf("bad CIDR: %s", out)
	}
}

// TestE2EKillRestart: reservations made, corrald SIGKILLed, restarted:
// every committed reservation is there and nothing is half-written.
func TestE2EKillRestart(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	addr := freePort(t)
	d := startCorrald(t, dataDir, addr)
	g := newGrpcurl(t, dataDir, addr)
	admin := adminToken(t, dataDir)
	if out, err := g.call(admin, "corral.pool.v1.NodeService/ApplyNode", `{"name":"n1","cpu_milli_cores":64000,"memory_bytes":"68719476736"}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := g.call(admin, "corral.pool.v1.NetworkService/ApplyNetwork", `{"name":"lan","ipv4_cidr":"10.1.0.0/24","ipv4_gateway":"10.1.0.1"}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := range 5 {
		if out, err := g.call(admin, "corral.pool.v1.NodeService/ReserveCompute",
			fmt.Sprintf(`{"node_name":"n1","compute_name":"vm%d","request_cpu_milli_core":1000,"limit_cpu_milli_core":2000,"request_memory_bytes":"1073741824","limit_memory_bytes":"1073741824"}`, i)); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if out, err := g.call(admin, "corral.pool.v1.NetworkService/ReserveNetworkInterface",
			fmt.Sprintf(`{"network_name":"lan","network_interface_name":"vm%d-0"}`, i)); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	startCorrald(t, dataDir, addr)
	out, err := g.call(admin, "corral.pool.v1.NodeService/GetNode", `{"name":"n1"}`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := range 5 {
		if !strings.Contains(out, fmt.Sprintf(`"vm%d"`, i)) {
			t.Errorf("compute vm%d lost after SIGKILL:\n%s", i, out)
		}
	}
	out, err = g.call(admin, "corral.pool.v1.NetworkService/GetNetwork", `{"name":"lan"}`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := range 5 {
		if !strings.Contains(out, fmt.Sprintf(`"vm%d-0"`, i)) || !strings.Contains(out, fmt.Sprintf(`"10.1.0.%d"`, i+2)) {
			t.Errorf("interface vm%d-0 lost after SIGKILL:\n%s", i, out)
		}
	}
}

// TestE2EGracefulShutdown: SIGTERM ends corrald with exit status 0.
func TestE2EGracefulShutdown(t *testing.T) {
	needE2E(t)
	d := startCorrald(t, t.TempDir(), freePort(t))
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, d.logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("corrald did not stop on SIGTERM")
	}
}

// TestE2ECorruptStore: a truncated store file stops corrald at start with
// an error naming the file; the file is untouched.
func TestE2ECorruptStore(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	addr := freePort(t)
	d := startCorrald(t, dataDir, addr)
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.exited
	db := filepath.Join(dataDir, "corral.db")
	b, _ := os.ReadFile(db)
	// Cut inside the pages in use: bbolt grows its file ahead of its data,
	// so half the file can still hold every page of a small store. Three
	// 4 KiB pages keep the two meta pages and lose the rest.
	cut := min(len(b)/2, 3*4096)
	if err := os.WriteFile(db, b[:cut], 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, filepath.Join(binDir, "corrald"), "serve", "--data-dir", dataDir, "--api-listen", addr)
	if err == nil {
		t.Fatalf("corrald started on a truncated store:\n%s", out)
	}
	if !strings.Contains(out, db) {
		t.Fatalf("error does not name %s:\n%s", db, out)
	}
	after, _ := os.ReadFile(db)
	if !bytes.Equal(after, b[:cut]) {
		t.Fatal("truncated store was modified")
	}
}

// TestE2ECLI drives the real corral CLI against the real corrald: apply an
// n0stack-style file, read it back, reserve through pool verbs, and check
// that a bad file changes nothing.
func TestE2ECLI(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	addr := freePort(t)
	startCorrald(t, dataDir, addr)
	corral := func(args ...string) (string, error) {
		return runCmd(t, filepath.Join(binDir, "corral"), append([]string{"--config", filepath.Join(dataDir, "admin.conf")}, args...)...)
	}
	good := filepath.Join(t.TempDir(), "pool.yaml")
	os.WriteFile(good, []byte(`kind: node
name: n1
cpu_milli_cores: 8000
memory_bytes: 16GiB
storage_bytes: 100GiB
rack: r1
---
kind: network
name: lan
ipv4_cidr: 10.9.0.0/24
ipv4_gateway: 10.9.0.1
dns_servers: [10.9.0.1]
annotations:
  n0core/provisioning/virtual_machine/vlan_id: "100"
`), 0o644)
	if out, err := corral("apply", "-f", good); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	out, err := corral("get", "nodes")
	if err != nil || !strings.Contains(out, "n1") || !strings.Contains(out, "READY") {
		t.Fatalf("get nodes: %v\n%s", err, out)
	}
	out, err = corral("node", "reserve-compute", "n1", "web0", "--request-cpu-milli-core", "500", "--limit-cpu-milli-core", "2000",
		"--request-memory-bytes", "1GiB", "--limit-memory-bytes", "1GiB", "-o", "json")
	if err != nil || !strings.Contains(out, `"web0"`) {
		t.Fatalf("reserve-compute: %v\n%s", err, out)
	}
	out, err = corral("network", "reserve-interface", "lan", "web0-0", "-o", "yaml")
	if err != nil || !strings.Contains(out, "10.9.0.2") {
		t.Fatalf("reserve-interface: %v\n%s", err, out)
	}
	out, err = corral("describe", "net", "lan")
	if err != nil || !strings.Contains(out, "vlan_id: 100") {
		t.Fatalf("describe net: %v\n%s", err, out)
	}
	before, _ := corral("get", "node", "n1", "-o", "json")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("kind: node\nname: n1\ncpu_milli_cores: 1\nmemory_bytes: 1\n---\nkind: network\nname: lan2\nipv4_cidr: 10.8.0.0/24\nipv4_gatway: 10.8.0.1\n"), 0o644)
	out, err = corral("apply", "-f", bad)
	if err == nil || !strings.Contains(out, "ipv4_gatway") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("bad apply: want one error line naming ipv4_gatway, got %v\n%s", err, out)
	}
	after, _ := corral("get", "node", "n1", "-o", "json")
	if before != after {
		t.Fatalf("a rejected file changed node n1:\n%s\n%s", before, after)
	}
	out, err = corral("delete", "node", "n1")
	if err == nil || !strings.Contains(out, "FailedPrecondition") {
		t.Fatalf("delete node with reservations: %v\n%s", err, out)
	}
	out, err = corral("get", "vm")
	if err != nil || out != "No virtual machines.\n" {
		t.Fatalf("get vm on an empty appliance: %v\n%s", err, out)
	}
}
