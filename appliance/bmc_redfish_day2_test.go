package appliance

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// redfishRig is the Redfish test server enrolled (its certificate
// pinned) on machine "f1" of an in-memory store, and a way to start BMC
// control over it again as a restarted appliance would.
type redfishRig struct {
	t      testing.TB
	rf     *redfishtest.Server
	st     store.Store
	inv    *inventory.Inventory
	sealer *seal.Sealer
	logs   *syncBuffer
}

func newRedfishRig(t testing.TB) *redfishRig {
	r := &redfishRig{t: t, rf: redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{}), st: mem.New(), logs: &syncBuffer{}}
	inv, err := inventory.New(inventory.Config{Store: r.st})
	if err != nil {
		t.Fatal(err)
	}
	r.inv = inv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if r.sealer, err = seal.Ensure(filepath.Join(t.TempDir(), seal.KeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.service(nil).Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: "f1", BmcAddress: r.rf.Addr(), BootMac: "52:54:00:00:00:91",
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: r.rf.User, BmcPassword: r.rf.Pass,
		BmcTlsSha256: r.rf.Fingerprint()}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *redfishRig) service(crash func(machine, step string) error, more ...func(*bmc.Config)) *bmc.Service {
	ad := bmcAdapter{c: ipmi.New(ipmi.Config{Providers: []string{ipmi.RedfishProviderName}})}
	cfg := bmc.Config{Machines: r.inv, Events: r.inv, Store: r.st, Driver: ad, Accounts: ad, Health: ad,
		Sealer: r.sealer, Crash: crash, CallTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range more {
		f(&cfg)
	}
	bc, err := bmc.New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return bc
}

// stored is the machine's BMC user name and password as stored, and its
// secret record.
func (r *redfishRig) stored() (string, string, *inventoryv1.BmcSecret) {
	r.t.Helper()
	return storedBMC(r.t, r.inv, r.st, r.sealer, "f1")
}

// login reports how the BMC answers user and password over Redfish.
func (r *redfishRig) login(user, pw string) error {
	tg := ipmi.Target{Host: r.rf.Host, Port: r.rf.Port, Protocol: ipmi.ProtocolRedfish, Username: user, Password: pw, Timeout: 5 * time.Second,
		TLSSHA256: r.rf.Fingerprint()}
	_, _, err := ipmi.New(ipmi.Config{}).PowerState(context.Background(), tg)
	return err
}

// TestBMCRotateRedfish: on the Redfish test server's AccountService, the
// first rotation makes corral-a in a free slot (the enrolment account
// stays), the second gives corral-b a new password, proves it and
// disables corral-a, whose password the BMC then refuses.
func TestBMCRotateRedfish(t *testing.T) {
	t.Parallel()
	r := newRedfishRig(t)
	ctx := context.Background()
	bc := r.service(nil)
	m, steps, err := bc.Rotate(ctx, "f1")
	if err != nil {
		t.Fatalf("rotate: %v (steps %q)", err, steps)
	}
	t.Logf("first rotation: %q", steps)
	user1, pw1, sec := r.stored()
	if user1 != "corral-a" || m.GetBmc().GetAccountId() < 2 || sec.GetPhase() != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE {
		t.Fatalf("after the first rotation: user %q, bmc %v, phase %v", user1, m.GetBmc(), sec.GetPhase())
	}
	if err := r.login(user1, pw1); err != nil {
		t.Fatalf("the new credential: %v", err)
	}
	if err := r.login(r.rf.User, r.rf.Pass); err != nil {
		t.Fatalf("the enrolment account stays: %v", err)
	}
	if _, steps, err = bc.Rotate(ctx, "f1"); err != nil {
		t.Fatalf("second rotate: %v (steps %q)", err, steps)
	}
	user2, pw2, _ := r.stored()
	if user2 != "corral-b" || r.login(user2, pw2) != nil {
		t.Fatalf("second rotation: %q does not log in", user2)
	}
	if err := r.login(user1, pw1); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("the old credential after rotation: want ErrAuth, got %v", err)
	}
	if _, err := bc.GetPower(ctx, "f1"); err != nil {
		t.Fatalf("power through BMC control after the rotation: %v", err)
	}
	if strings.Contains(r.logs.String(), pw1) || strings.Contains(r.logs.String(), pw2) {
		t.Fatal("a password Corral made is in the log")
	}
}

// TestBMCRotateRedfishCrashRecovers: an appliance that dies at any step
// of a rotation on a Redfish BMC resumes at start-up without a lockout.
func TestBMCRotateRedfishCrashRecovers(t *testing.T) {
	t.Parallel()
	r := newRedfishRig(t)
	ctx := context.Background()
	died := errors.New("appliance died")
	for _, at := range []string{"pending", "bmc-set", "set", "verified", "committed"} {
		userBefore, pwBefore, _ := r.stored()
		crashing := r.service(func(_, step string) error {
			if step == at {
				return died
			}
			return nil
		})
		if _, steps, err := crashing.Rotate(ctx, "f1"); !errors.Is(err, died) {
			t.Fatalf("crash at %s: rotate returned %v (steps %q)", at, err, steps)
		}
		restarted := r.service(nil)
		if n := restarted.ResumeRotations(ctx, nil); n != 1 {
			t.Fatalf("crash at %s: %d rotations resumed, want 1:\n%s", at, n, r.logs.String())
		}
		user, pw, sec := r.stored()
		if sec.GetPhase() != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE {
			t.Fatalf("crash at %s: left at phase %v", at, sec.GetPhase())
		}
		if err := r.login(user, pw); err != nil {
			t.Fatalf("crash at %s: the stored credential %q does not log in: %v", at, user, err)
		}
		switch {
		case at == "pending":
			if user != userBefore || pw != pwBefore {
				t.Fatalf("crash at %s: credential changed to %q", at, user)
			}
		case user == userBefore || pw == pwBefore:
			t.Fatalf("crash at %s: the rotation was not finished (user %q)", at, user)
		case userBefore != r.rf.User:
			if err := r.login(userBefore, pwBefore); !errors.Is(err, ipmi.ErrAuth) {
				t.Fatalf("crash at %s: the old credential %q: want ErrAuth, got %v", at, userBefore, err)
			}
		}
		t.Logf("crash at %s: recovered as %q", at, user)
	}
	if _, steps, err := r.service(nil).Rotate(ctx, "f1"); err != nil {
		t.Fatalf("rotate after the crashes: %v (%q)", err, steps)
	}
}

func healthFlagOf(t testing.TB, inv *inventory.Inventory, name string) string {
	t.Helper()
	m, err := inv.GetMachine(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.GetFlags() {
		if strings.HasPrefix(f, bmc.FlagHealth) {
			return f
		}
	}
	return ""
}

// TestBMCHealthRedfish: a Redfish BMC's Thermal, Power and SEL polled
// through BMC control: healthy, nothing flagged; a fan under its
// threshold flags the machine; a Critical log entry keeps the flag once
// the fan is back, and clearing the log clears it.
func TestBMCHealthRedfish(t *testing.T) {
	t.Parallel()
	r := newRedfishRig(t)
	ctx := context.Background()
	bc := r.service(nil)
	refresh := func() string {
		t.Helper()
		if err := bc.RefreshHealth(ctx, "f1"); err != nil {
			t.Fatal(err)
		}
		return healthFlagOf(t, r.inv, "f1")
	}
	if f := refresh(); f != "" {
		t.Fatalf("a healthy machine flagged %q", f)
	}
	m, _ := r.inv.GetMachine(ctx, "f1")
	if h := m.GetBmc().GetHealth(); h.GetStatus() != "ok" || len(h.GetSensors()) != 6 {
		t.Fatalf("health %v", h)
	}
	sick := redfishtest.DefaultHealth()
	sick.Fans[0].Reading = 400
	r.rf.SetHealth(sick)
	if f := refresh(); !strings.Contains(f, "critical") || !strings.Contains(f, "Fan1 400 RPM past lcr") {
		t.Fatalf("a fan under its threshold: flag %q", f)
	}
	sick = redfishtest.DefaultHealth()
	sick.Temperatures[0].Health = "Critical"
	r.rf.SetHealth(sick)
	if f := refresh(); !strings.Contains(f, "CPU1 Temp 45 degrees C past health") {
		t.Fatalf("Status.Health Critical: flag %q", f)
	}
	logged := redfishtest.DefaultHealth()
	logged.SEL = []redfishtest.LogEntry{{ID: 7, Created: "2026-11-29T08:10:00Z", Severity: "Critical", Message: "PSU1 AC lost"}}
	r.rf.SetHealth(logged)
	if f := refresh(); !strings.Contains(f, "event log entry 7: PSU1 AC lost") {
		t.Fatalf("a Critical log entry: flag %q", f)
	}
	r.rf.SetHealth(redfishtest.DefaultHealth())
	if f := refresh(); f != "" {
		t.Fatalf("the log cleared and the sensors back: flag %q", f)
	}
}

// BenchmarkBMCHealthPollRedfish prints what one health poll of a Redfish
// BMC costs (6 sensors, a 2-entry SEL): CPU per poll, the in-process test
// server's share included, and store writes.
func BenchmarkBMCHealthPollRedfish(b *testing.B) {
	r := newRedfishRig(b)
	h := redfishtest.DefaultHealth()
	h.SEL = []redfishtest.LogEntry{{ID: 1, Created: "2026-11-29T08:00:00Z", Severity: "OK", Message: "System boot"},
		{ID: 2, Created: "2026-11-29T08:01:00Z", Severity: "Warning", Message: "Fan2 redundancy degraded"}}
	r.rf.SetHealth(h)
	var writes atomic.Int64
	bc := r.service(nil, func(c *bmc.Config) { c.OnHealthWrite = func() { writes.Add(1) } })
	ctx := context.Background()
	if err := bc.RefreshHealth(ctx, "f1"); err != nil {
		b.Fatal(err)
	}
	writes.Store(0)
	hs0 := r.rf.Handshakes()
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := bc.RefreshHealth(ctx, "f1"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/poll")
	hs := float64(r.rf.Handshakes()-hs0) / float64(b.N)
	b.ReportMetric(float64(writes.Load())/float64(b.N), "writes/poll")
	b.ReportMetric(hs, "handshakes/poll")
	b.Logf("Redfish: %v CPU per poll (server included), %.1f TLS handshakes and %.2f store writes per poll (%d polls)",
		cpu/time.Duration(b.N), hs, float64(writes.Load())/float64(b.N), b.N)
}
