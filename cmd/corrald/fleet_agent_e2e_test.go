package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	agentsession "github.com/corralhq/corral/agent/session"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// heldInstaller takes a plan, reports it, and waits for proceed before it
// makes its key, has it signed and reports done.
type heldInstaller struct {
	plans   chan *nodev1.InstallPlan
	proceed chan struct{}
	signed  chan error
}

func (h *heldInstaller) Install(ctx context.Context, plan *nodev1.InstallPlan, sign func(context.Context, []byte) ([]byte, error), progress func(*nodev1.Progress)) error {
	select {
	case h.plans <- plan:
	default:
	}
	select {
	case <-h.proceed:
	case <-ctx.Done():
		return ctx.Err()
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: plan.GetHostname()}}, key)
	if err != nil {
		return err
	}
	_, err = sign(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	h.signed <- err
	if err != nil {
		return err
	}
	progress(&nodev1.Progress{Step: "identity", Detail: "node key made, certificate signed", InstallId: plan.GetInstallId()})
	progress(&nodev1.Progress{Step: "done", Done: true, InstallId: plan.GetInstallId()})
	return nil
}

func (h *heldInstaller) Wipe(context.Context, *nodev1.WipePlan, func(*nodev1.Progress)) error {
	return errors.New("not in this test")
}

type noPower struct{}

func (noPower) PowerOff() error { return nil }
func (noPower) Reboot() error   { return nil }

// TestE2EFleetAgentFailover: a discovery agent (the real session client)
// registers on appliance a; the operator accepts the machine through b,
// and the plan — a record on the machine — reaches the agent through a.
// a is then killed with SIGKILL mid-install: the agent moves to b, its
// certificate request is signed there and its "done" is recorded.
func TestE2EFleetAgentFailover(t *testing.T) {
	needE2E(t)
	c := etcdtest.New(t, 3)
	a, b, dirA := startFleet(t, c)
	out, err := runCmd(t, filepath.Join(binDir, "corrald"), "token", "create", "--role", "agent", "--data-dir", t.TempDir(),
		"--store", "etcd", "--etcd-endpoints", c.EndpointsFlag(), "--etcd-prefix", "/e2e")
	if err != nil {
		t.Fatalf("agent token: %v\n%s", err, out)
	}
	token := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	cc, err := clientconfig.Load(filepath.Join(dirA, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	fp, err := pki.Fingerprint([]byte(cc.CACert))
	if err != nil {
		t.Fatal(err)
	}
	inst := &heldInstaller{plans: make(chan *nodev1.InstallPlan, 4), proceed: make(chan struct{}), signed: make(chan error, 4)}
	const mac = "52:54:00:12:00:01"
	console := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agentDone := make(chan error, 1)
	go func() {
		agentDone <- agentsession.Run(ctx, agentsession.Config{
			Endpoints: []string{a.addr, b.addr}, Token: token, CAFingerprint: fp, BootMAC: mac, AgentVersion: "e2e",
			Facts: func(context.Context) *inventoryv1.Facts { return machinefacts.QEMU("FLEET-1", "", mac) },
			Power: noPower{}, Installer: inst, Heartbeat: time.Second, RPCTimeout: 5 * time.Second, Console: console,
			Backoff: agentsession.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
		})
	}()

	cb := *cc
	cb.Endpoint = b.addr
	conn, err := clientconfig.Dial(&cb)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	machines := inventoryv1.NewMachineServiceClient(conn)
	var name string
	waitUntil(t, "the agent registered", 30*time.Second, func() bool {
		ms, err := machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
		for _, m := range ms.GetMachines() {
			if m.GetSerial() == "FLEET-1" && m.GetState() == inventoryv1.Machine_INVENTORIED {
				name = m.GetName()
			}
		}
		return err == nil && name != ""
	})
	// An attacker with the (public) boot token opens a second session on
	// b while the agent's is alive on a: refused, naming a.
	atk := *cc
	atk.Endpoint, atk.Token = b.addr, token
	aconn, err := clientconfig.Dial(&atk)
	if err != nil {
		t.Fatal(err)
	}
	defer aconn.Close()
	ac := nodev1.NewAgentServiceClient(aconn)
	reg, err := ac.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: machinefacts.QEMU("FLEET-1", "", mac)})
	if err != nil {
		t.Fatalf("attacker's Register: %v", err)
	}
	as, err := ac.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := as.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: reg.GetSessionId()}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := as.Recv(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "on appliance a") {
		t.Fatalf("second session on b while the agent's is alive on a: %v, want FailedPrecondition naming appliance a", err)
	}
	if _, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: name, Disk: "auto"}); err != nil {
		t.Fatal(err)
	}
	var plan *nodev1.InstallPlan
	select {
	case plan = <-inst.plans:
	case <-time.After(30 * time.Second):
		t.Fatal("the plan accepted through b never reached the agent on a")
	}
	if got := plan.GetApplianceEndpoint(); got != a.addr && !strings.HasSuffix(got, portOf(a.addr)) {
		t.Logf("plan names %s first (a is %s)", got, a.addr)
	}

	// a dies mid-install.
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	killed := time.Now()
	close(inst.proceed)
	select {
	case err := <-inst.signed:
		if err != nil {
			t.Fatalf("certificate request after failover: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the certificate request was never answered after a died")
	}
	waitUntil(t, "install done recorded through b", 30*time.Second, func() bool {
		m, err := machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
		return err == nil && m.GetInstall().GetDone()
	})
	t.Logf("install done on b %s after a was killed", time.Since(killed).Round(time.Millisecond))
	// The agent's console tells which appliance it was on when the plan
	// came: a, before the failover.
	con := console.String()
	onA := strings.Index(con, "registered as "+name+" with "+a.addr)
	plan1 := strings.Index(con, "appliance sent install plan")
	moved := strings.Index(con, "registering with "+b.addr)
	if onA < 0 || plan1 < onA || moved < plan1 {
		t.Errorf("the plan accepted through b was not delivered by a, which held the session; agent console:\n%s", con)
	}
	if !strings.Contains(b.logs.String(), "node certificate signed") {
		t.Error("the certificate request after the failover was not signed by b")
	}
	cancel()
	<-agentDone
}

func portOf(addr string) string { return addr[strings.LastIndex(addr, ":"):] }

func waitUntil(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
