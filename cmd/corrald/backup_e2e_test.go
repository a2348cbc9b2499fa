package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

var (
	nodeBinOnce sync.Once
	nodeBinErr  error
)

// nodeBinary builds corral-node (-race) beside corrald, once.
func nodeBinary(t *testing.T) string {
	t.Helper()
	nodeBinOnce.Do(func() {
		out, err := exec.Command("go", "build", "-race", "-o", binDir+"/", "github.com/corralhq/corral/cmd/corral-node").CombinedOutput()
		if err != nil {
			nodeBinErr = fmt.Errorf("build corral-node: %v\n%s", err, out)
		}
	})
	if nodeBinErr != nil {
		t.Fatal(nodeBinErr)
	}
	return filepath.Join(binDir, "corral-node")
}

// TestE2EBackupRestore backs up a running appliance (a machine with an
// ipmi_sim BMC, a joined hypervisor node, tokens), stops it, restores the
// backup into a new data directory and starts corrald there on the same
// address: the node reconnects and is READY, power status works (the
// restored seal key opens the BMC password), the old operator token works
// and the machines are the same. A wrong passphrase, a truncated file and
// a flipped byte are refused and write nothing.
func TestE2EBackupRestore(t *testing.T) {
	needE2E(t)
	require.Tool(t, "ipmi_sim")
	node := nodeBinary(t)
	ctx := context.Background()
	root := t.TempDir()
	dirA, addr := filepath.Join(root, "a"), freePort(t)
	a := startCorrald(t, dirA, addr)

	cc, err := clientconfig.Load(filepath.Join(dirA, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	machines := inventoryv1.NewMachineServiceClient(conn)
	tokens := authv1.NewTokenServiceClient(conn)
	bmc := ipmisim.Start(t, ipmisim.Options{})
	if _, err := machines.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: bmc.Addr(),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: bmc.User, BmcPassword: bmc.Pass}); err != nil {
		t.Fatal(err)
	}
	if _, err := machines.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: "m1"}); err != nil {
		t.Fatalf("power status before the backup: %v", err)
	}
	op, err := tokens.CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_OPERATOR, Description: "e2e operator"})
	if err != nil {
		t.Fatal(err)
	}
	nt, err := tokens.CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_NODE, Node: "n1", Description: "e2e node"})
	if err != nil {
		t.Fatal(err)
	}

	// A real corral-node hypervisor joins (no VM is started, so no QEMU).
	caFile := filepath.Join(root, "ca.pem")
	if err := os.WriteFile(caFile, []byte(cc.CACert), 0o644); err != nil {
		t.Fatal(err)
	}
	nodeLog := &syncbuf.Buffer{}
	nc := exec.Command(node, "hypervisor", "--name", "n1", "--join", addr, "--token", nt.GetToken(), "--ca-cert", caFile,
		"--data-dir", filepath.Join(root, "node"), "--listen", freePort(t), "--advertise", "127.0.0.1", "--accel", "tcg")
	nc.Stdout, nc.Stderr = nodeLog, nodeLog
	nc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := nc.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan struct{})
	go func() { nc.Wait(); close(nodeDone) }()
	t.Cleanup(func() {
		syscall.Kill(-nc.Process.Pid, syscall.SIGKILL)
		<-nodeDone
		if t.Failed() {
			t.Logf("corral-node log:\n%s", nodeLog.String())
		}
	})
	waitNodeReady(t, poolv1.NewNodeServiceClient(conn), time.Time{})
	before := machineNames(t, machines)

	pass := filepath.Join(root, "passphrase")
	os.WriteFile(pass, []byte("a long enough passphrase\n"), 0o600)
	file := filepath.Join(root, "lab.backup")
	out, err := runCmd(t, filepath.Join(binDir, "corral"), "--config", filepath.Join(dirA, "admin.conf"), "backup", "-o", file, "--passphrase-file", pass)
	if err != nil || !strings.Contains(out, "wrote "+file) {
		t.Fatalf("corral backup: %v\n%s", err, out)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v %v", fi, err)
	}
	if _, err := os.Stat(file + ".partial"); !os.IsNotExist(err) {
		t.Errorf("%s.partial left behind", file)
	}
	t.Logf("corral backup: %s", strings.TrimSpace(out))

	// Stop A; B starts from the backup on the same address.
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-a.exited; err != nil {
		t.Fatalf("corrald A: %v\n%s", err, a.logs.String())
	}

	data, _ := os.ReadFile(file)
	truncated, flipped := filepath.Join(root, "truncated"), filepath.Join(root, "flipped")
	os.WriteFile(truncated, data[:len(data)*2/3], 0o600)
	bad := slices.Clone(data)
	bad[len(bad)-200] ^= 0x40
	os.WriteFile(flipped, bad, 0o600)
	wrong := filepath.Join(root, "wrong")
	os.WriteFile(wrong, []byte("not the passphrase at all\n"), 0o600)
	// The restore and the refusals run side by side (each costs a scrypt
	// of a -race binary), and wait for each other here.
	dirB := filepath.Join(root, "b")
	t.Run("restore", func(t *testing.T) {
		t.Run("good", func(t *testing.T) {
			t.Parallel()
			out, err := runCmd(t, filepath.Join(binDir, "corrald"), "restore", file, "--data-dir", dirB, "--passphrase-file", pass)
			if err != nil || !strings.Contains(out, "restored backup of appliance") {
				t.Fatalf("corrald restore: %v\n%s", err, out)
			}
			t.Logf("corrald restore:\n%s", out)
		})
		for name, tc := range map[string]struct{ file, pass, want string }{
			"wrong passphrase": {file, wrong, "wrong passphrase"},
			"truncated":        {truncated, pass, "truncated or altered"},
			"byte flipped":     {flipped, pass, "truncated or altered"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				dir := filepath.Join(root, "refused-"+strings.ReplaceAll(name, " ", "-"))
				out, err := runCmd(t, filepath.Join(binDir, "corrald"), "restore", tc.file, "--data-dir", dir, "--passphrase-file", tc.pass)
				if err == nil || !strings.Contains(out, tc.want) || !strings.Contains(out, "nothing was written") {
					t.Fatalf("restore: %v, want a refusal saying %q and that nothing was written:\n%s", err, tc.want, out)
				}
				t.Logf("refused: %s", out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("%s exists after a refused restore", dir)
				}
			})
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".*restore-*")); len(left) > 0 {
		t.Errorf("temporary directories left: %v", left)
	}

	if out, err := runCmd(t, filepath.Join(binDir, "corrald"), "restore", file, "--data-dir", dirB, "--passphrase-file", pass); err == nil || !strings.Contains(out, "already holds a store") {
		t.Errorf("restore over the restored directory: %v\n%s", err, out)
	}

	restarted := time.Now()
	startCorrald(t, dirB, addr)
	// The operator token made on A works on B.
	ob := *cc
	ob.Token = op.GetToken()
	connB, err := clientconfig.Dial(&ob)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close()
	machinesB := inventoryv1.NewMachineServiceClient(connB)
	if d := cmp.Diff(before, machineNames(t, machinesB)); d != "" {
		t.Errorf("machines on B differ from A's (-A +B):\n%s", d)
	}
	ps, err := machinesB.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: "m1"})
	if err != nil {
		t.Fatalf("power status on B (the restored seal key must open the BMC password): %v", err)
	}
	t.Logf("power status on B: %s via %s", ps.GetState(), ps.GetProvider())
	waitNodeReady(t, poolv1.NewNodeServiceClient(connB), restarted)
}

// machineNames lists the machines as name=state.
func machineNames(t *testing.T, c inventoryv1.MachineServiceClient) []string {
	t.Helper()
	resp, err := c.ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range resp.GetMachines() {
		out = append(out, m.GetName()+"="+m.GetState().String())
	}
	slices.Sort(out)
	return out
}

// waitNodeReady waits for node n1 to be READY with a heartbeat after since.
func waitNodeReady(t *testing.T, c poolv1.NodeServiceClient, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := c.GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
		cancel()
		if err == nil && n.GetState() == poolv1.Node_READY && n.GetLastHeartbeat().AsTime().After(since) {
			return
		}
		last = fmt.Sprint(n.GetState(), " ", n.GetLastHeartbeat().AsTime(), " ", err)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("node n1 not READY with a heartbeat after %s (last: %s)", since.Format(time.RFC3339Nano), last)
}
