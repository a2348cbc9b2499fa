package lifecycle

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/agent/tpm"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/tpmid"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/swtpm"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// The TPM proof at the agent edge: AttestBegin, then Register carrying
// the activated secret, against swtpm TPMs.

// attestEdge is an inventory and lifecycle behind an AgentServer with a
// TPM verifier and metadata callers.
type attestEdge struct {
	inv *inventory.Inventory
	lc  *Lifecycle
	lis *bufconn.Listener
	clk *fakeclock.Clock
}

func newAttestEdge(tb testing.TB) *attestEdge {
	tb.Helper()
	st := mem.New()
	clk := fakeclock.New(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))
	inv, err := inventory.New(inventory.Config{Store: st, Now: clk.Now})
	if err != nil {
		tb.Fatal(err)
	}
	p, err := pool.New(pool.Config{Store: st, Now: clk.Now})
	if err != nil {
		tb.Fatal(err)
	}
	lc, err := New(Config{Machines: inv, Events: inv, Nodes: p, Identity: nopIdentity{}, Now: clk.Now, Interval: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	RegisterAgent(gs, &AgentServer{Lifecycle: lc, Caller: mdCaller, TPM: tpmid.New(tpmid.Config{Now: clk.Now})})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = inv.Run(ctx) }()
	go func() { defer wg.Done(); _ = gs.Serve(lis) }()
	tb.Cleanup(func() { gs.Stop(); cancel(); wg.Wait() })
	return &attestEdge{inv: inv, lc: lc, lis: lis, clk: clk}
}

func (e *attestEdge) client(tb testing.TB, c Caller) nodev1.AgentServiceClient {
	tb.Helper()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return e.lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(callerCreds(c)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return nodev1.NewAgentServiceClient(cc)
}

// entries are a MAC's timeline entries named event.
func (e *attestEdge) entries(tb testing.TB, mac, event string) []*inventoryv1.TimelineEntry {
	tb.Helper()
	ctx := context.Background()
	if err := e.inv.FlushTimeline(ctx); err != nil {
		tb.Fatal(err)
	}
	es, err := e.inv.Timeline(ctx, "", mac, 0)
	if err != nil {
		tb.Fatal(err)
	}
	var out []*inventoryv1.TimelineEntry
	for _, x := range es {
		if x.GetEvent() == event {
			out = append(out, x)
		}
	}
	return out
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type nopIdentity struct{}

func (nopIdentity) SignNode(context.Context, string, []byte) ([]byte, error) {
	return nil, errors.New("no CA here")
}
func (nopIdentity) CACertPEM() []byte { return nil }

// swtpmDevice starts a swtpm for tb and opens it as the agent does.
func swtpmDevice(tb testing.TB) *tpm.Device {
	tb.Helper()
	require.Tool(tb, "swtpm")
	ctx, cancel := context.WithCancel(context.Background())
	sw, err := swtpm.Start(ctx, tb.TempDir(), swtpm.Commands)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cancel(); sw.Stop() })
	rwc, err := sw.Dial()
	if err != nil {
		tb.Fatal(err)
	}
	d, err := tpm.OpenChannel(rwc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// prove runs AttestBegin for mac with d and returns the proof.
func prove(ctx context.Context, tb testing.TB, c nodev1.AgentServiceClient, d *tpm.Device, mac string) *nodev1.TpmProof {
	tb.Helper()
	req, err := d.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	req.BootMac = mac
	ch, err := c.AttestBegin(ctx, req)
	if err != nil {
		tb.Fatal(err)
	}
	secret, err := d.Activate(ch)
	if err != nil {
		tb.Fatal(err)
	}
	return &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}
}

func TestRegisterWithTPMProof(t *testing.T) {
	ctx := context.Background()
	e := newAttestEdge(t)
	a, b := swtpmDevice(t), swtpmDevice(t)
	const macA, macB = "52:54:00:00:70:0a", "52:54:00:00:70:0b"
	agentA := e.client(t, Caller{Role: CallerAgent, ID: "tok-a", MAC: macA, Machine: "m-52540000700a"})
	agentB := e.client(t, Caller{Role: CallerAgent, ID: "tok-b", MAC: macB, Machine: "m-52540000700b"})
	register := func(c nodev1.AgentServiceClient, mac, serial string, proof *nodev1.TpmProof) error {
		_, err := c.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: facts(serial, "", mac), Tpm: proof})
		return err
	}

	// The right proof passes, and the timeline says which EK was proved.
	if err := register(agentA, macA, "SN-A", prove(ctx, t, agentA, a, macA)); err != nil {
		t.Fatalf("Register with A's proof: %v", err)
	}
	if es := e.entries(t, macA, "tpm-proved"); len(es) != 1 || len(es[0].GetAttributes()["ek"]) != 64 {
		t.Fatalf("tpm-proved entries %v, want one naming the EK", es)
	}

	// A machine without a TPM registers as before.
	if err := register(agentB, macB, "SN-B", nil); err != nil {
		t.Fatalf("Register without a TPM: %v", err)
	}

	// Replayed: the challenge was used by the first Register.
	proof := prove(ctx, t, agentA, a, macA)
	if err := register(agentA, macA, "SN-A", proof); err != nil {
		t.Fatal(err)
	}
	if err := register(agentA, macA, "SN-A", proof); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replayed proof: %v, want FailedPrecondition", err)
	}

	// Expired.
	proof = prove(ctx, t, agentA, a, macA)
	e.clk.Advance(tpmid.DefaultTTL)
	if err := register(agentA, macA, "SN-A", proof); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("expired proof: %v, want FailedPrecondition", err)
	}

	// Another caller's challenge: B's token presents A's fresh proof.
	proof = prove(ctx, t, agentA, a, macA)
	if err := register(agentB, macB, "SN-B", proof); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("A's proof under B's token: %v, want PermissionDenied", err)
	}
	if es := e.entries(t, macB, "register-refused"); len(es) == 0 {
		t.Fatal("the refused proof is not on B's timeline")
	}

	// A token asks for a challenge for another boot MAC.
	req, err := a.Begin()
	if err != nil {
		t.Fatal(err)
	}
	req.BootMac = macA
	if _, err := agentB.AttestBegin(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("AttestBegin for another MAC: %v, want PermissionDenied", err)
	}

	// Another TPM: B's TPM, with B's AK, names A's EK; it cannot
	// release the secret sealed to A's EK.
	reqB, err := b.Begin()
	if err != nil {
		t.Fatal(err)
	}
	reqB.BootMac, reqB.EkPublic, reqB.EkCertificate = macB, req.GetEkPublic(), req.GetEkCertificate()
	ch, err := agentB.AttestBegin(ctx, reqB)
	if err != nil {
		t.Fatal(err)
	}
	secret, _ := b.Activate(ch) // an error or garbage
	if err := register(agentB, macB, "SN-B", &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: append(secret, make([]byte, 32-len(secret))...)}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("B answering for A's EK: %v, want PermissionDenied", err)
	}
	// And B's own proof still works.
	if err := register(agentB, macB, "SN-B", prove(ctx, t, agentB, b, macB)); err != nil {
		t.Fatalf("B's own proof: %v", err)
	}

	// A node certificate gets no challenge.
	node := e.client(t, Caller{Role: CallerNode, Node: "m-a"})
	if _, err := node.AttestBegin(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("AttestBegin with a node certificate: %v, want PermissionDenied", err)
	}
}

// BenchmarkRegisterTPM measures Register through the agent edge with and
// without the TPM proof, against swtpm: the proof's round trip
// (AttestBegin, the TPM's ActivateCredential) and the appliance's CPU for
// it. The AK is made once, as the agent does once per boot. Figures
// printed, not asserted.
func BenchmarkRegisterTPM(b *testing.B) {
	ctx := context.Background()
	e := newAttestEdge(b)
	const mac = "52:54:00:00:71:01"
	c := e.client(b, Caller{Role: CallerAgent, ID: "tok-bench", MAC: mac, Machine: "m-525400007101"})
	d := swtpmDevice(b)
	if _, err := d.Begin(); err != nil {
		b.Fatal(err)
	}
	f := facts("SN-BENCH", "", mac)
	for _, name := range []string{"without", "with"} {
		b.Run(name, func(b *testing.B) {
			cpu0 := processCPU()
			for b.Loop() {
				var proof *nodev1.TpmProof
				if name == "with" {
					proof = prove(ctx, b, c, d, mac)
				}
				if _, err := c.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f, Tpm: proof}); err != nil {
					b.Fatal(err)
				}
			}
			// The test process's CPU (appliance and agent sides, both in
			// process), not swtpm's: that is the machine's TPM.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// TestTPMBindsTheRecord: the endorsement key a machine proves at its
// first registration with a TPM is bound to its record; a later report
// must prove the same key — without it, or with another TPM, the report is
// parked in CONFLICT — and with it the machine is recognised even from a
// MAC it never listed (a NIC swap needs no operator).
func TestTPMBindsTheRecord(t *testing.T) {
	ctx := context.Background()
	e := newAttestEdge(t)
	a, b := swtpmDevice(t), swtpmDevice(t)
	const macA, macC = "52:54:00:00:71:0a", "52:54:00:00:71:0c"
	agentA := e.client(t, Caller{Role: CallerAgent, ID: "tok-a", MAC: macA, Machine: "m-52540000710a"})
	agentC := e.client(t, Caller{Role: CallerAgent, ID: "tok-c", MAC: macC, Machine: "m-52540000710c"})
	register := func(c nodev1.AgentServiceClient, mac string, proof *nodev1.TpmProof) (*nodev1.RegisterResponse, error) {
		return c.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: facts("SN-TPM", "", mac), Tpm: proof})
	}
	r, err := register(agentA, macA, prove(ctx, t, agentA, a, macA))
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.inv.GetMachine(ctx, r.GetMachineName())
	if err != nil || len(m.GetEkIdentity()) != 64 {
		t.Fatalf("machine %v (%v): want its EK bound", m.GetEkIdentity(), err)
	}
	bound := m.GetEkIdentity()

	// From its own boot MAC without the proof: parked.
	if _, err := register(agentA, macA, nil); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "TPM endorsement key") {
		t.Fatalf("report without the bound key's proof: %v, want parked", err)
	}
	// Another TPM from its boot MAC: parked.
	if _, err := register(agentA, macA, prove(ctx, t, agentA, b, macA)); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not the recorded") {
		t.Fatalf("report proving another TPM: %v, want parked", err)
	}
	if got, _ := e.inv.GetMachine(ctx, m.GetName()); got.GetEkIdentity() != bound || got.GetBootMac() != macA {
		t.Fatalf("the record changed: ek %s boot %s", got.GetEkIdentity(), got.GetBootMac())
	}
	if err := e.inv.RejectMachine(ctx, "conflict-52540000710a"); err != nil {
		t.Fatal(err)
	}
	// Its own TPM from a MAC it never listed: recognised.
	r, err = register(agentC, macC, prove(ctx, t, agentC, a, macC))
	if err != nil || r.GetMachineName() != m.GetName() {
		t.Fatalf("the machine's own TPM from a new NIC: %v, %v; want %s", r.GetMachineName(), err, m.GetName())
	}
}
