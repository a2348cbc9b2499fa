package appliance

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// rotationRig is one ipmi_sim BMC enrolled (as its administrator) on
// machine "r1" of an in-memory store, and a way to start BMC control
// over it again as a restarted appliance would.
type rotationRig struct {
	t      *testing.T
	sim    *ipmisim.BMC
	st     store.Store
	inv    *inventory.Inventory
	sealer *seal.Sealer
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newRotationRig(t *testing.T) *rotationRig {
	r := &rotationRig{t: t, sim: ipmisim.Start(t, ipmisim.Options{}), st: mem.New(), logs: &syncBuffer{}}
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
	if _, err := r.service(nil).Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: "r1", BmcAddress: r.sim.Addr(), BootMac: "52:54:00:00:00:71",
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: r.sim.User, BmcPassword: r.sim.Pass}); err != nil {
		t.Fatal(err)
	}
	return r
}

// service is BMC control as an appliance starts it (crash: the test's
// crash point, or nil; now: its clock, if not time.Now).
func (r *rotationRig) service(crash func(machine, step string) error, now ...func() time.Time) *bmc.Service {
	ctl := ipmi.New(ipmi.Config{Providers: []string{ipmi.NativeProviderName}})
	bc, err := bmc.New(bmc.Config{Machines: r.inv, Events: r.inv, Store: r.st, Driver: bmcAdapter{c: ctl}, Accounts: bmcAdapter{c: ctl},
		Sealer: r.sealer, Crash: crash, CallTimeout: 5 * time.Second, Now: append(now, time.Now)[0], Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		r.t.Fatal(err)
	}
	return bc
}

// stored is the machine's BMC user name and password as stored (the
// password opened from its sealed blob), and its secret record.
func (r *rotationRig) stored() (string, string, *inventoryv1.BmcSecret) {
	r.t.Helper()
	return storedBMC(r.t, r.inv, r.st, r.sealer, "r1")
}

// storedBMC is machine's BMC user name and password as stored in st (the
// password opened with sealer), and its secret record.
func storedBMC(t testing.TB, inv *inventory.Inventory, st store.Store, sealer *seal.Sealer, machine string) (string, string, *inventoryv1.BmcSecret) {
	t.Helper()
	ctx := context.Background()
	m, err := inv.GetMachine(ctx, machine)
	if err != nil {
		t.Fatal(err)
	}
	var sec inventoryv1.BmcSecret
	if _, err := record.Get(ctx, st, store.BMCSecretsPrefix+machine, &sec); err != nil {
		t.Fatal(err)
	}
	pw, err := sealer.Open(sec.GetSealedPassword(), []byte(machine))
	if err != nil {
		t.Fatal(err)
	}
	return m.GetBmc().GetUsername(), string(pw), &sec
}

// login reports how the BMC answers user and password.
func (r *rotationRig) login(user, pw string) error {
	tg := ipmi.Target{Host: "127.0.0.1", Port: r.sim.Port, Protocol: ipmi.ProtocolIPMI, Username: user, Password: pw, Timeout: 5 * time.Second}
	_, _, err := ipmi.New(ipmi.Config{Providers: []string{ipmi.NativeProviderName}}).PowerState(context.Background(), tg)
	return err
}

// noPassword fails when a password Corral made shows in what leaves the
// appliance: API answers (steps, the BMC record), the timeline, the log.
func (r *rotationRig) noPassword(pw string, answers ...string) {
	r.t.Helper()
	tl, err := r.inv.Timeline(context.Background(), "r1", "", 100)
	if err != nil {
		r.t.Fatal(err)
	}
	var all strings.Builder
	for _, e := range tl {
		all.WriteString(e.String() + "\n")
	}
	all.WriteString(r.logs.String())
	for _, a := range answers {
		all.WriteString(a)
	}
	if strings.Contains(all.String(), pw) {
		r.t.Fatalf("a BMC password Corral made left the appliance:\n%s", all.String())
	}
}

// TestBMCRotateSim: on ipmi_sim, the first rotation makes Corral's own
// account and leaves the enrolment account alone; the second gives the
// other account a new password, proves it and disables the first, whose
// password the BMC then refuses. No password shows outside the store.
func TestBMCRotateSim(t *testing.T) {
	t.Parallel()
	r := newRotationRig(t)
	ctx := context.Background()
	bc := r.service(nil)
	m, steps, err := bc.Rotate(ctx, "r1")
	if err != nil {
		t.Fatalf("rotate: %v (steps %q)", err, steps)
	}
	user1, pw1, sec := r.stored()
	if user1 != "corral-a" || m.GetBmc().GetAccountId() < 3 || m.GetBmc().GetRotatedAt() == nil || m.GetBmc().GetRotation() != "" ||
		sec.GetPhase() != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE || len(sec.GetPendingSealedPassword()) != 0 {
		t.Fatalf("after the first rotation: user %q, bmc %v, secret phase %v", user1, m.GetBmc(), sec.GetPhase())
	}
	if pw1 == r.sim.Pass || len(pw1) != ipmi.PasswordLength {
		t.Fatalf("the new password is not a new random one")
	}
	t.Logf("first rotation: %q", steps)
	if err := r.login(user1, pw1); err != nil {
		t.Fatalf("the new credential: %v", err)
	}
	if err := r.login(r.sim.User, r.sim.Pass); err != nil {
		t.Fatalf("the enrolment account is the operator's and stays: %v", err)
	}
	if _, err := bc.GetPower(ctx, "r1"); err != nil {
		t.Fatalf("power through BMC control after the rotation: %v", err)
	}
	m, steps2, err := bc.Rotate(ctx, "r1")
	if err != nil {
		t.Fatalf("second rotate: %v (steps %q)", err, steps2)
	}
	t.Logf("second rotation: %q", steps2)
	user2, pw2, _ := r.stored()
	if user2 != "corral-b" {
		t.Fatalf("second rotation: user %q, want corral-b", user2)
	}
	if err := r.login(user2, pw2); err != nil {
		t.Fatalf("the new credential: %v", err)
	}
	if err := r.login(user1, pw1); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("the old credential after rotation: want refused (ErrAuth), got %v", err)
	}
	// The timeline is written behind the call.
	rotated := 0
	for deadline := time.Now().Add(5 * time.Second); rotated != 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		tl, err := r.inv.Timeline(ctx, "r1", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		rotated = 0
		for _, e := range tl {
			if e.GetEvent() == "bmc-rotated" {
				rotated++
			}
		}
	}
	if rotated != 2 {
		t.Fatalf("timeline has %d bmc-rotated entries, want 2", rotated)
	}
	// On a schedule: nothing is due within the hour; two hours on, the
	// account Corral owns is rotated again.
	if n := bc.RotateDue(ctx, time.Hour, nil); n != 0 {
		t.Fatalf("rotated %d machines with nothing due", n)
	}
	later := r.service(nil, func() time.Time { return time.Now().Add(2 * time.Hour) })
	if n := later.RotateDue(ctx, time.Hour, nil); n != 1 {
		t.Fatalf("scheduled rotation: %d machines rotated, want 1:\n%s", n, r.logs.String())
	}
	if user3, pw3, _ := r.stored(); user3 != "corral-a" || r.login(user3, pw3) != nil || r.login(user2, pw2) == nil {
		t.Fatalf("after the scheduled rotation the machine logs in as %q; the one before must be refused", user3)
	}
	answers := strings.Join(append(steps, steps2...), "\n") + m.GetBmc().String()
	r.noPassword(pw1, answers)
	r.noPassword(pw2, answers)
}

// TestBMCRotateCrashRecovers: an appliance that dies at any step of a
// rotation — before the BMC heard the new password, after the BMC took it
// but before the store committed it, after verifying — is never locked
// out: at start-up the rotation is finished with the pending credential
// or abandoned for the one in use, and the machine answers.
func TestBMCRotateCrashRecovers(t *testing.T) {
	t.Parallel()
	r := newRotationRig(t)
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
		if _, steps, err := crashing.Rotate(ctx, "r1"); !errors.Is(err, died) {
			t.Fatalf("crash at %s: rotate returned %v (steps %q)", at, err, steps)
		}
		// The appliance starts again.
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
		if _, err := restarted.GetPower(ctx, "r1"); err != nil {
			t.Fatalf("crash at %s: power after recovery: %v", at, err)
		}
		switch at {
		case "pending":
			// The BMC never heard of it: the credential in use stays.
			if user != userBefore || pw != pwBefore {
				t.Fatalf("crash at %s: credential changed to %q", at, user)
			}
		default:
			// The BMC took it: the rotation is finished.
			if user == userBefore || pw == pwBefore {
				t.Fatalf("crash at %s: the rotation was not finished (user %q)", at, user)
			}
			if userBefore != r.sim.User {
				if err := r.login(userBefore, pwBefore); !errors.Is(err, ipmi.ErrAuth) {
					t.Fatalf("crash at %s: the old credential %q: want refused, got %v", at, userBefore, err)
				}
			}
		}
		t.Logf("crash at %s: recovered as %q", at, user)
		r.noPassword(pw)
	}
	// And a plain rotation still works afterwards.
	if _, steps, err := r.service(nil).Rotate(ctx, "r1"); err != nil {
		t.Fatalf("rotate after the crashes: %v (%q)", err, steps)
	}
}
