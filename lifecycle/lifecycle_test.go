package lifecycle

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
)

// fakeIdentity signs requests with a throwaway CA: CN and DNS SAN = the
// name it is given, the request's public key; it records each name.
type fakeIdentity struct {
	mu     sync.Mutex
	signed []string
	fail   error
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	serial int64
}

func newFakeIdentity(t *testing.T) *fakeIdentity {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return &fakeIdentity{ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), serial: 0x100}
}

func (f *fakeIdentity) SignNode(_ context.Context, name string, csrPEM []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	block, _ := pem.Decode(csrPEM)
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	f.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(f.serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.ca, csr.PublicKey, f.caKey)
	if err != nil {
		return nil, err
	}
	f.signed = append(f.signed, name)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func (f *fakeIdentity) CACertPEM() []byte { return f.caPEM }

func (f *fakeIdentity) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.signed...)
}

// fakeRevoker records the node names whose certificates are revoked.
type fakeRevoker struct {
	mu    sync.Mutex
	names []string
}

func (f *fakeRevoker) RevokeNode(_ context.Context, name, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names = append(f.names, name)
	return nil
}

func (f *fakeRevoker) revoked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.names...)
}

// harness is one appliance: inventory, pool, lifecycle and the agent
// gRPC service on bufconn, over st.
type harness struct {
	t      *testing.T
	st     store.Store
	clk    *fakeclock.Clock
	id     *fakeIdentity
	certs  *fakeRevoker
	inv    *inventory.Inventory
	pool   *pool.Pool
	lc     *Lifecycle
	bmc    *fakePower
	client nodev1.AgentServiceClient
	msrv   *inventory.MachineServer
	stop   func()
}

type harnessOpt struct {
	clk        *fakeclock.Clock
	autoAccept []string
	auto       bool
	// kexec and kexecTimeout are Config.Kexec and KexecTimeout.
	kexec        HypervisorBoot
	kexecTimeout time.Duration
	kexecAhead   bool // Config.KexecAhead
}

func newHarness(t *testing.T, st store.Store, o harnessOpt) *harness {
	t.Helper()
	if st == nil {
		st = mem.New()
	}
	clk := o.clk
	if clk == nil {
		clk = fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	}
	inv, err := inventory.New(inventory.Config{Store: st, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.New(pool.Config{Store: st, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakePower{}
	id := newFakeIdentity(t)
	certs := &fakeRevoker{}
	lc, err := New(Config{Machines: inv, Events: inv, Nodes: p, Identity: id, Certs: certs, BMC: fb, Now: clk.Now,
		Endpoint: func(string) string { return "10.0.0.1:20180" }, Interval: time.Hour,
		AutoAccept: o.auto, AutoAcceptSelectors: o.autoAccept, Kexec: o.kexec, KexecTimeout: o.kexecTimeout, KexecAhead: o.kexecAhead})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	RegisterAgent(gs, &AgentServer{Lifecycle: lc})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = inv.Run(ctx) }()
	go func() { defer wg.Done(); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, st: st, clk: clk, id: id, certs: certs, inv: inv, pool: p, lc: lc, bmc: fb,
		client: nodev1.NewAgentServiceClient(cc), msrv: &inventory.MachineServer{Inv: inv, Lifecycle: lc}}
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cc.Close()
			gs.Stop()
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(h.stop)
	return h
}

// agent is a raw discovery agent session.
type agent struct {
	t      *testing.T
	name   string
	stream nodev1.AgentService_SessionClient
	cancel context.CancelFunc
	msgs   chan *nodev1.ApplianceMessage
}

// connect registers mac with facts and opens a session; it returns after
// the appliance's first `wait`.
func (h *harness) connect(mac string, f *inventoryv1.Facts, capabilities ...string) *agent {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := h.client.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f, Capabilities: capabilities})
	if err != nil {
		h.t.Fatal(err)
	}
	stream, err := h.client.Session(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: resp.GetSessionId()}}}); err != nil {
		h.t.Fatal(err)
	}
	a := &agent{t: h.t, name: resp.GetMachineName(), stream: stream, cancel: cancel, msgs: make(chan *nodev1.ApplianceMessage, 16)}
	go func() {
		defer close(a.msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			a.msgs <- m
		}
	}()
	if m := a.next(); m.GetWait() == nil {
		h.t.Fatalf("first message %v, want wait", m)
	}
	h.t.Cleanup(cancel)
	return a
}

func (a *agent) next() *nodev1.ApplianceMessage {
	a.t.Helper()
	select {
	case m, ok := <-a.msgs:
		if !ok {
			a.t.Fatal("session closed")
		}
		return m
	case <-time.After(5 * time.Second):
		a.t.Fatal("no message from the appliance")
	}
	return nil
}

func (a *agent) none() {
	a.t.Helper()
	select {
	case m, ok := <-a.msgs:
		if ok {
			a.t.Fatalf("unexpected message %v", m)
		}
	case <-time.After(100 * time.Millisecond):
	}
}

func (a *agent) progress(id, step string, done bool, errText string) {
	a.t.Helper()
	if err := a.stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: &nodev1.Progress{
		InstallId: id, Step: step, Done: done, Error: errText}}}); err != nil {
		a.t.Fatal(err)
	}
}

func (a *agent) close() {
	a.cancel()
	for range a.msgs {
	}
}

// eventually polls the machine until ok or 5 s.
func (h *harness) eventually(name string, what string, ok func(m *inventoryv1.Machine) bool) *inventoryv1.Machine {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var m *inventoryv1.Machine
	for time.Now().Before(deadline) {
		var err error
		m, err = h.inv.GetMachine(context.Background(), name)
		if err == nil && ok(m) {
			return m
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("machine %s never %s; last %v state %v reason %q install %v", name, what, m.GetName(), m.GetState(), m.GetStateReason(), m.GetInstall())
	return nil
}

func (h *harness) machine(name string) *inventoryv1.Machine {
	h.t.Helper()
	m, err := h.inv.GetMachine(context.Background(), name)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

func (h *harness) reconcile() {
	h.t.Helper()
	if err := h.lc.ReconcileOnce(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) applyNode(name string) {
	h.t.Helper()
	if _, err := h.pool.ApplyNode(context.Background(), &poolv1.ApplyNodeRequest{Name: name, Address: "10.0.0.50", CpuMilliCores: 4000, MemoryBytes: 8 << 30, StorageBytes: 100 << 30}); err != nil {
		h.t.Fatal(err)
	}
}

func code(err error) codes.Code { return status.Code(toStatus(err)) }

const mac1 = "52:54:00:00:00:01"

func TestAcceptRefusals(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	if _, err := h.inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "bare", BootMac: "52:54:00:00:00:09"}); err != nil {
		t.Fatal(err)
	}
	a := h.connect(mac1, facts("S1", "", mac1))
	// In order: each case's setup builds on the ones before.
	for _, tc := range []struct {
		case_ string
		setup func()
		name  string
		disk  string
		want  codes.Code
		text  string
	}{
		{case_: "unknown", name: "nope", want: codes.NotFound},
		{case_: "no facts yet", name: "bare", want: codes.FailedPrecondition, text: "no facts"},
		{case_: "bad disk", name: a.name, disk: "/dev/sdz", want: codes.InvalidArgument, text: "/dev/vda, /dev/vdb"},
		{case_: "maintenance", name: a.name, want: codes.FailedPrecondition, text: "MAINTENANCE", setup: func() {
			if _, err := h.lc.SetMaintenance(ctx, a.name, true, "fan"); err != nil {
				t.Fatal(err)
			}
		}},
		{case_: "deployed", name: a.name, want: codes.FailedPrecondition, text: "already deployed: reprovision it first", setup: func() {
			if _, err := h.lc.SetMaintenance(ctx, a.name, false, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := h.inv.UpdateMachine(ctx, a.name, func(m *inventoryv1.Machine) error { m.State = inventoryv1.Machine_DEPLOYED; return nil }); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		if tc.setup != nil {
			tc.setup()
		}
		_, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: tc.name, Disk: tc.disk})
		if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.case_, err, tc.want, tc.text)
		}
	}
	a.none()
}

func TestResolveDisk(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m", Facts: &inventoryv1.Facts{Disks: []*inventoryv1.Facts_Disk{
		{Name: "sda", SizeBytes: 100}, {Name: "sdb", SizeBytes: 500, Removable: true}, {Name: "nvme0n1", SizeBytes: 300},
	}}}
	for in, want := range map[string]string{"auto": "/dev/nvme0n1", "": "/dev/nvme0n1", "sda": "/dev/sda", "/dev/sdb": "/dev/sdb"} {
		got, err := resolveDisk(m, in)
		if err != nil || got != want {
			t.Errorf("resolveDisk(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := resolveDisk(m, "/dev/sdc"); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("unknown disk: %v", err)
	}
}

func TestInstallHappyPath(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	m, err := h.msrv.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: a.name, Disk: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetDisk() != "/dev/vdb" {
		t.Fatalf("accepted: %v %v", m.GetState(), m.GetInstall())
	}
	plan := a.next().GetInstall()
	// Exactly these fields: no certificate, no key (the agent makes the
	// key and sends a certificate request).
	want := &nodev1.InstallPlan{Disk: "/dev/vdb", Hostname: a.name, MachineName: a.name, InstallId: m.GetInstall().GetInstallId(),
		CaCertPem: string(h.id.CACertPEM()), ApplianceEndpoint: "10.0.0.1:20180", ApplianceEndpoints: []string{"10.0.0.1:20180"}}
	if diff := cmp.Diff(want, plan, protocmp.Transform()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	if len(plan.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("plan carries unknown fields: %x", plan.ProtoReflect().GetUnknown())
	}
	id := plan.GetInstallId()
	// The agent makes its key and has its certificate signed.
	key := newKey(t)
	a.csr(id, csrFor(t, key, "whatever"))
	if c := a.next().GetCertificate(); c.GetError() != "" || certOf(t, c).Subject.CommonName != a.name {
		t.Fatalf("certificate %v", c)
	}
	// A stale install id is ignored.
	a.progress("other", "partition", false, "")
	a.progress(id, "partition", false, "")
	h.eventually(a.name, "at partition", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "partition" })
	a.progress("other", "format", false, "boom")
	a.progress(id, "done", true, "")
	m = h.eventually(a.name, "installed", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetDone() })
	if m.GetState() != inventoryv1.Machine_INSTALLING || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR || m.GetInstall().GetStep() != "done" {
		t.Fatalf("after done: %v %v %v", m.GetState(), m.GetBootIntent(), m.GetInstall())
	}
	// No BMC: the agent is told to reboot, and the watchdog is armed.
	if a.next().GetReboot() == nil {
		t.Fatal("no reboot command")
	}
	if m.GetWatchdog().GetArmedAt() == nil {
		h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedAt() != nil })
	}
	// The node registers and is READY: DEPLOYED.
	h.clk.Advance(time.Minute)
	h.applyNode(a.name)
	h.reconcile()
	m = h.machine(a.name)
	if m.GetState() != inventoryv1.Machine_DEPLOYED || m.GetNodeName() != a.name || m.GetWatchdog() != nil {
		t.Fatalf("after node READY: %v node %q watchdog %v", m.GetState(), m.GetNodeName(), m.GetWatchdog())
	}
}

func TestInstallErrorFails(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(context.Background(), a.name, "vda", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "format", false, "")
	a.progress(id, "", true, "mkfs.ext4: exit 1")
	m := h.eventually(a.name, "FAILED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_FAILED })
	if m.GetStateReason() != "install step format: mkfs.ext4: exit 1" {
		t.Fatalf("reason %q", m.GetStateReason())
	}
	// FAILED can be accepted again.
	if _, err := h.lc.Accept(context.Background(), a.name, "auto", true); err != nil {
		t.Fatal(err)
	}
	if p := a.next().GetInstall(); p.GetInstallId() == id || !p.GetWipe() {
		t.Fatalf("second plan %v", p)
	}
}

func TestPlanSentOnConnectAndReconnect(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a := h.connect(mac1, facts("S1", "", mac1))
	a.close()
	h.eventually(a.name, "disconnected", func(*inventoryv1.Machine) bool { return !h.lc.sess.connected(a.name) })
	m, err := h.lc.Accept(context.Background(), a.name, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if m.GetInstall().GetSentAt() != nil {
		t.Fatal("plan marked sent with no agent")
	}
	b := h.connect(mac1, facts("S1", "", mac1))
	p1 := b.next().GetInstall()
	if p1.GetInstallId() != m.GetInstall().GetInstallId() {
		t.Fatalf("plan on connect: %v", p1)
	}
	b.progress(p1.GetInstallId(), "disk", false, "")
	h.eventually(a.name, "at disk", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "disk" })
	b.close()
	// The agent reboots mid-install and comes back: the plan is re-sent.
	c := h.connect(mac1, facts("S1", "", mac1))
	if p2 := c.next().GetInstall(); p2.GetInstallId() != p1.GetInstallId() {
		t.Fatalf("re-sent plan %v", p2)
	}
	// The reconciler does not send it again on the same session.
	h.reconcile()
	c.none()
}

func TestInstallTimeout(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "partition", false, "")
	h.eventually(a.name, "at partition", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "partition" })
	h.clk.Advance(DefaultInstallTimeout - time.Second)
	h.reconcile()
	if st := h.machine(a.name).GetState(); st != inventoryv1.Machine_INSTALLING {
		t.Fatalf("failed early: %v", st)
	}
	h.clk.Advance(2 * time.Second)
	h.reconcile()
	m := h.machine(a.name)
	if m.GetState() != inventoryv1.Machine_FAILED || !strings.Contains(m.GetStateReason(), "after step partition") {
		t.Fatalf("after timeout: %v %q", m.GetState(), m.GetStateReason())
	}
	// Late progress of that install is ignored.
	a.progress(id, "done", true, "")
	time.Sleep(50 * time.Millisecond)
	if m := h.machine(a.name); m.GetState() != inventoryv1.Machine_FAILED || m.GetInstall().GetDone() {
		t.Fatalf("late progress applied: %v", m.GetInstall())
	}
}

// TestRestartMidInstall closes the appliance (bolt store and all) during
// an install; the new appliance re-sends the plan when the agent
// reconnects, and fails an install whose agent never comes back.
func TestRestartMidInstall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	open := func() store.Store {
		st, err := bolt.Open(path, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st1 := open()
	h1 := newHarness(t, st1, harnessOpt{clk: clk})
	a := h1.connect(mac1, facts("S1", "", mac1))
	b := h1.connect("52:54:00:00:00:02", facts("S2", "", "52:54:00:00:00:02"))
	for _, x := range []*agent{a, b} {
		if _, err := h1.lc.Accept(context.Background(), x.name, "", false); err != nil {
			t.Fatal(err)
		}
	}
	id := a.next().GetInstall().GetInstallId()
	b.next()
	a.progress(id, "format", false, "")
	h1.eventually(a.name, "at format", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "format" })
	a.close()
	b.close()
	h1.stop()
	if err := st1.Close(); err != nil {
		t.Fatal(err)
	}

	h2 := newHarness(t, open(), harnessOpt{clk: clk})
	t.Cleanup(func() { h2.stop(); h2.st.Close() })
	a2 := h2.connect(mac1, facts("S1", "", mac1))
	if p := a2.next().GetInstall(); p.GetInstallId() != id {
		t.Fatalf("after restart: plan %v", p)
	}
	a2.progress(id, "done", true, "")
	h2.eventually(a.name, "installed", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetDone() })
	// b never comes back: FAILED by the timeout, naming the plan.
	clk.Advance(DefaultInstallTimeout + time.Second)
	h2.reconcile()
	if m := h2.machine(b.name); m.GetState() != inventoryv1.Machine_FAILED || !strings.Contains(m.GetStateReason(), "install timeout") {
		t.Fatalf("b: %v %q", m.GetState(), m.GetStateReason())
	}
}

// enrollBMC gives a machine a BMC record, as enrolment does; the fake
// Power answers for it.
func enrollBMC(t *testing.T, h *harness, name string) {
	t.Helper()
	if _, err := h.inv.UpdateMachine(context.Background(), name, func(m *inventoryv1.Machine) error {
		m.Bmc = &inventoryv1.Bmc{Address: "10.9.0.1", Username: "admin"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// fakePower records the BMC actions the lifecycle asks for.
type fakePower struct {
	mu      sync.Mutex
	boots   []inventory.BootRequest
	actions []inventoryv1.PowerAction
}

func (f *fakePower) SetBootDevice(_ context.Context, _ string, req inventory.BootRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boots = append(f.boots, req)
	return nil
}

func (f *fakePower) SetPower(_ context.Context, _ string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, a)
	return &inventoryv1.PowerStatus{State: inventoryv1.PowerState_POWER_STATE_ON, Provider: "fake"}, nil
}

func (f *fakePower) log() ([]inventory.BootRequest, []inventoryv1.PowerAction) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]inventory.BootRequest(nil), f.boots...), append([]inventoryv1.PowerAction(nil), f.actions...)
}

// facts is the report of a small QEMU machine.
var facts = machinefacts.QEMU

func TestInstallDoneRebootsThroughBMC(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a := h.connect(mac1, facts("S1", "", mac1))
	enrollBMC(t, h, a.name)
	if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "done", true, "")
	h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedAt() != nil })
	// The watchdog is armed in the same mutation that records done; the
	// power cycle follows.
	var boots []inventory.BootRequest
	var acts []inventoryv1.PowerAction
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if boots, acts = h.bmc.log(); len(acts) > 0 {
			break
		}
	}
	if len(boots) != 1 || boots[0].Device != inventoryv1.BootDevice_BOOT_DEVICE_PXE || len(acts) != 1 || acts[0] != inventoryv1.PowerAction_POWER_ACTION_CYCLE {
		t.Fatalf("BMC: boots %v actions %v", boots, acts)
	}
	a.none() // no Reboot command over the session
}

func TestBootWatchdog(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	if _, err := h.inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r1", BootMac: mac1}); err != nil {
		t.Fatal(err)
	}
	enrollBMC(t, h, "r1")
	h.inv.Event(mac1, "http", "http-refused", "catalog file unreadable", map[string]string{"path": "/images/hypervisor-initrd.img", "status": "404"})
	if _, err := h.msrv.SetPower(ctx, &inventoryv1.SetPowerRequest{Name: "r1", Action: inventoryv1.PowerAction_POWER_ACTION_ON}); err != nil {
		t.Fatal(err)
	}
	if h.machine("r1").GetWatchdog().GetArmedAt() == nil {
		t.Fatal("power on did not arm the watchdog")
	}
	if err := h.inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= DefaultBootWatchdogCycles; n++ {
		h.clk.Advance(DefaultBootWatchdog - time.Second)
		h.reconcile()
		if c := h.machine("r1").GetWatchdog().GetCycles(); c != uint32(n-1) {
			t.Fatalf("cycled early: %d", c)
		}
		h.clk.Advance(2 * time.Second)
		h.reconcile()
		if c := h.machine("r1").GetWatchdog().GetCycles(); c != uint32(n) {
			t.Fatalf("cycle %d: count %d", n, c)
		}
	}
	_, acts := h.bmc.log()
	cycles := 0
	for _, a := range acts {
		if a == inventoryv1.PowerAction_POWER_ACTION_CYCLE {
			cycles++
		}
	}
	if cycles != DefaultBootWatchdogCycles {
		t.Fatalf("BMC actions %v", acts)
	}
	if err := h.inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(DefaultBootWatchdog + time.Second)
	h.reconcile()
	m := h.machine("r1")
	want := "boot watchdog: no agent after 5m0s ×3; last: http http-refused status=404 path=/images/hypervisor-initrd.img: catalog file unreadable"
	if m.GetState() != inventoryv1.Machine_FAILED || m.GetStateReason() != want || m.GetWatchdog() != nil {
		t.Fatalf("after cycles: %v %q, want %q", m.GetState(), m.GetStateReason(), want)
	}
	if err := h.inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	es, _ := h.inv.Timeline(ctx, "r1", "", 0)
	var wd int
	for _, e := range es {
		if e.GetSource() == "watchdog" {
			wd++
		}
	}
	if wd != DefaultBootWatchdogCycles+1 {
		t.Fatalf("%d watchdog timeline entries", wd)
	}
}

func TestBootWatchdogDisarmedByRegisterAndWithoutBMCFails(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(ctx, a.name, "", false); err != nil {
		t.Fatal(err)
	}
	h.lc.armWatchdog(ctx, a.name, "test")
	// The discovery agent restarts (its old session ends) and registers
	// again: disarmed. (A second session while the first is alive is
	// refused: agent_test.go.)
	a.close()
	b := h.connect(mac1, facts("S1", "", mac1))
	if h.machine(a.name).GetWatchdog() != nil {
		t.Fatal("register did not disarm")
	}
	id := b.next().GetInstall().GetInstallId()
	b.progress(id, "done", true, "")
	if b.next().GetReboot() == nil {
		t.Fatal("no reboot")
	}
	h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedAt() != nil })
	h.clk.Advance(DefaultBootWatchdog + time.Second)
	h.reconcile()
	m := h.machine(a.name)
	if m.GetState() != inventoryv1.Machine_FAILED || !strings.HasPrefix(m.GetStateReason(), "boot watchdog: no agent after 5m0s (no BMC") {
		t.Fatalf("%v %q", m.GetState(), m.GetStateReason())
	}
}

func TestReprovision(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(ctx, a.name, "vda", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "done", true, "")
	a.next() // reboot
	a.close()
	h.clk.Advance(time.Second)
	h.applyNode(a.name)
	h.reconcile()
	if st := h.machine(a.name).GetState(); st != inventoryv1.Machine_DEPLOYED {
		t.Fatalf("state %v", st)
	}
	if _, err := h.pool.ReserveCompute(ctx, a.name, "vm1", &poolv1.Compute{RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	_, err := h.msrv.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: a.name})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "compute/vm1") {
		t.Fatalf("with a reservation: %v", err)
	}
	if err := h.pool.ReleaseCompute(ctx, a.name, "vm1"); err != nil {
		t.Fatal(err)
	}
	m, err := h.msrv.ReprovisionMachine(ctx, &inventoryv1.ReprovisionMachineRequest{Name: a.name})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_DISCOVERED || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER ||
		m.GetWipe().GetDisk() != "/dev/vda" || !strings.Contains(m.GetStateReason(), "reboot the machine") {
		t.Fatalf("reprovisioned: %v %v %v %q", m.GetState(), m.GetBootIntent(), m.GetWipe(), m.GetStateReason())
	}
	if _, err := h.pool.GetNode(ctx, a.name); !errors.Is(err, apierr.ErrNotFound) {
		t.Fatalf("node kept: %v", err)
	}
	// The discovery agent comes back: INVENTORIED, wipe sent, cleared when done.
	b := h.connect(mac1, facts("S1", "", mac1))
	if st := h.machine(a.name).GetState(); st != inventoryv1.Machine_INVENTORIED {
		t.Fatalf("after register: %v", st)
	}
	w := b.next().GetWipe()
	if w.GetDisk() != "/dev/vda" || w.GetInstallId() == "" {
		t.Fatalf("wipe %v", w)
	}
	b.progress(w.GetInstallId(), "wipe", true, "")
	h.eventually(a.name, "wiped", func(m *inventoryv1.Machine) bool { return m.GetWipe() == nil })
}

func TestReprovisionPowerCyclesWithBMC(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a := h.connect(mac1, facts("S1", "", mac1))
	enrollBMC(t, h, a.name)
	m, err := h.lc.Reprovision(context.Background(), a.name)
	if err != nil {
		t.Fatal(err)
	}
	boots, acts := h.bmc.log()
	if len(boots) != 1 || len(acts) != 1 || acts[0] != inventoryv1.PowerAction_POWER_ACTION_CYCLE {
		t.Fatalf("BMC boots %v actions %v", boots, acts)
	}
	if m.GetWatchdog().GetArmedAt() == nil || strings.Contains(m.GetStateReason(), "reboot the machine") {
		t.Fatalf("watchdog %v reason %q", m.GetWatchdog(), m.GetStateReason())
	}
}

func TestMaintenance(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(ctx, a.name, "", false); err != nil {
		t.Fatal(err)
	}
	a.next()
	m, err := h.msrv.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: a.name, On: true, Reason: "disk swap"})
	if err != nil || m.GetState() != inventoryv1.Machine_MAINTENANCE || m.GetStateReason() != "disk swap" {
		t.Fatalf("on: %v %v", m.GetState(), err)
	}
	if _, intent, _ := h.inv.BootIntent(ctx, mac1); intent != inventoryv1.BootIntent_BOOT_INTENT_LOCAL {
		t.Fatalf("boot intent in maintenance %v", intent)
	}
	// No automation: neither the install timeout nor the watchdog act.
	h.lc.armWatchdog(ctx, a.name, "test")
	h.clk.Advance(DefaultInstallTimeout * 2)
	h.reconcile()
	if st := h.machine(a.name).GetState(); st != inventoryv1.Machine_MAINTENANCE {
		t.Fatalf("automation touched a machine in maintenance: %v", st)
	}
	m, err = h.msrv.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: a.name, On: false})
	if err != nil || m.GetState() != inventoryv1.Machine_INSTALLING {
		t.Fatalf("off: %v %v", m.GetState(), err)
	}
	h.reconcile()
	if st := h.machine(a.name).GetState(); st != inventoryv1.Machine_INSTALLING {
		t.Fatalf("restored install timed out at once: %v", st)
	}
	if _, err := h.msrv.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: a.name, On: false}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("off twice: %v", err)
	}
	if _, err := h.msrv.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: "nope", On: true}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown: %v", err)
	}
}

func TestAutoAccept(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{auto: true, autoAccept: []string{"disks>=2"}})
	a := h.connect(mac1, facts("S1", "", mac1))
	if p := a.next().GetInstall(); p.GetDisk() != "/dev/vdb" {
		t.Fatalf("auto-accepted plan %v", p)
	}
	one := facts("S2", "", "52:54:00:00:00:02")
	one.Disks = one.Disks[:1]
	b := h.connect("52:54:00:00:00:02", one)
	b.none()
	if st := h.machine(b.name).GetState(); st != inventoryv1.Machine_INVENTORIED {
		t.Fatalf("non-matching machine: %v", st)
	}
}

// TestDeployedByNodeWatch: with Run running, a node becoming READY makes
// its INSTALLING machine DEPLOYED without waiting for the interval.
func TestDeployedByNodeWatch(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.lc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "done", true, "")
	a.next()
	time.Sleep(50 * time.Millisecond) // the watch is up
	h.applyNode(a.name)
	h.eventually(a.name, "DEPLOYED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_DEPLOYED })
}

// TestAutoAcceptDoesNotPowerCycle: auto-accept at registration waits for
// the agent's session instead of power-cycling the booting machine.
func TestAutoAcceptDoesNotPowerCycle(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{auto: true})
	ctx := context.Background()
	if _, err := h.inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r1", BootMac: mac1}); err != nil {
		t.Fatal(err)
	}
	enrollBMC(t, h, "r1")
	a := h.connect(mac1, facts("S1", "", mac1))
	if p := a.next().GetInstall(); p == nil {
		t.Fatal("no plan")
	}
	if _, acts := h.bmc.log(); len(acts) != 0 {
		t.Fatalf("BMC actions %v", acts)
	}
}

// TestInstallDoneWithoutAnyWayToReboot: done arms the watchdog in the same
// mutation; with no BMC and no session to send Reboot on, it is disarmed
// again and the timeline says to reboot by hand.
func TestInstallDoneWithoutAnyWayToReboot(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	ctx := context.Background()
	a := h.connect(mac1, facts("S1", "", mac1))
	if _, err := h.lc.Accept(ctx, a.name, "", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.close()
	h.eventually(a.name, "disconnected", func(*inventoryv1.Machine) bool { return !h.lc.sess.connected(a.name) })
	h.lc.onProgress(ctx, a.name, &nodev1.Progress{InstallId: id, Step: "done", Done: true})
	m := h.machine(a.name)
	if !m.GetInstall().GetDone() || m.GetWatchdog() != nil {
		t.Fatalf("done %v watchdog %v", m.GetInstall().GetDone(), m.GetWatchdog())
	}
	if err := h.inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	es, _ := h.inv.Timeline(ctx, a.name, "", 0)
	if last := es[len(es)-1]; last.GetEvent() != "reboot-failed" || !strings.Contains(last.GetDetail(), "reboot the machine by hand") {
		t.Fatalf("last entry %s: %s", last.GetEvent(), last.GetDetail())
	}
}
