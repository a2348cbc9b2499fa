package bmc

import (
	"context"
	"errors"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// userBMC is a BMC with user accounts: a login needs an enabled user's
// password. down: nothing answers; deaf: accounts are set but never log
// in (a BMC that takes the commands and ignores them).
type userBMC struct {
	mu         sync.Mutex
	users      map[string]string // name -> password ("" disabled)
	ids        map[string]uint32
	down, deaf bool
}

func (u *userBMC) login(t Target) (Result, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.down {
		return Result{}, apierr.Unavailablef("%s: no answer", t)
	}
	if pw, ok := u.users[t.Username]; !ok || pw == "" || pw != t.Password {
		return Result{Provider: "fake"}, ErrAuth
	}
	return Result{Provider: "fake"}, nil
}

func (u *userBMC) PowerState(_ context.Context, t Target) (inventoryv1.PowerState, Result, error) {
	res, err := u.login(t)
	return inventoryv1.PowerState_POWER_STATE_OFF, res, err
}

func (u *userBMC) SetPower(context.Context, Target, inventoryv1.PowerAction) (Result, error) {
	return Result{}, errors.New("not here")
}

func (u *userBMC) SetBootDevice(context.Context, Target, inventory.BootRequest) (Result, error) {
	return Result{}, errors.New("not here")
}

func (u *userBMC) NewPassword() string { return "fresh-" + string(rune('a'+len(u.ids))) }

func (u *userBMC) SetAccount(_ context.Context, t Target, a Account) (uint32, Result, error) {
	if res, err := u.login(t); err != nil {
		return 0, res, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.ids[a.Name]; !ok {
		u.ids[a.Name] = uint32(len(u.ids) + 3)
	}
	if u.deaf {
		u.users[a.Name] = ""
	} else {
		u.users[a.Name] = a.Password
	}
	return u.ids[a.Name], Result{Provider: "fake"}, nil
}

func (u *userBMC) DisableAccount(_ context.Context, t Target, id uint32) (Result, error) {
	if res, err := u.login(t); err != nil {
		return res, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for n, i := range u.ids {
		if i == id {
			u.users[n] = ""
		}
	}
	return Result{Provider: "fake"}, nil
}

func newRotation(t *testing.T, crash func(machine, step string) error) (*inventory.Inventory, store.Store, *userBMC, *Service) {
	t.Helper()
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	u := &userBMC{users: map[string]string{"admin": "pw"}, ids: map[string]uint32{"admin": 2}}
	c, err := New(Config{Machines: inv, Events: inv, Store: st, Driver: u, Accounts: u, Sealer: xorSealer{}, Crash: crash})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, enrollReq("m1", "10.0.0.9", "pw")); err != nil {
		t.Fatal(err)
	}
	return inv, st, u, c
}

func secretOf(t *testing.T, st store.Store) *inventoryv1.BmcSecret {
	t.Helper()
	var sec inventoryv1.BmcSecret
	if _, err := record.Get(context.Background(), st, bmcSecretPrefix+"m1", &sec); err != nil {
		t.Fatal(err)
	}
	return &sec
}

// TestRotateNeitherLogsInKeepsBoth: a rotation left pending on a BMC that
// then stops answering is neither finished nor abandoned: both
// credentials stay, and the rotation finishes once the BMC is back.
func TestRotateNeitherLogsInKeepsBoth(t *testing.T) {
	died := errors.New("died")
	inv, st, u, c := newRotation(t, func(_, step string) error {
		if step == "bmc-set" {
			return died
		}
		return nil
	})
	ctx := context.Background()
	if _, _, err := c.Rotate(ctx, "m1"); !errors.Is(err, died) {
		t.Fatalf("rotate: %v", err)
	}
	u.down = true
	c.cfg.Crash = nil
	_, steps, err := c.Rotate(ctx, "m1")
	if !errors.Is(err, apierr.ErrUnavailable) {
		t.Fatalf("neither logs in: want Unavailable, got %v (%q)", err, steps)
	}
	if sec := secretOf(t, st); sec.GetPhase() != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_PENDING || len(sec.GetPendingSealedPassword()) == 0 {
		t.Fatalf("the pending credential was dropped: phase %v", sec.GetPhase())
	}
	if m, _ := inv.GetMachine(ctx, "m1"); m.GetBmc().GetUsername() != "admin" || m.GetBmc().GetRotation() != "pending" {
		t.Fatalf("machine bmc %v", m.GetBmc())
	}
	u.down = false
	if n := c.ResumeRotations(ctx, nil); n != 1 {
		t.Fatalf("resumed %d", n)
	}
	if m, _ := inv.GetMachine(ctx, "m1"); m.GetBmc().GetUsername() != "corral-a" || m.GetBmc().GetRotation() != "" {
		t.Fatalf("after the BMC came back: %v", m.GetBmc())
	}
}

// TestRotateUnprovenIsAbandoned: a BMC that takes the account but does
// not log it in leaves the machine on the credential in use, with the
// stray account disabled.
func TestRotateUnprovenIsAbandoned(t *testing.T) {
	inv, st, u, c := newRotation(t, nil)
	u.deaf = true
	ctx := context.Background()
	if _, steps, err := c.Rotate(ctx, "m1"); err == nil {
		t.Fatalf("an unproven credential was committed (%q)", steps)
	}
	if sec := secretOf(t, st); sec.GetPhase() != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE {
		t.Fatalf("phase %v", sec.GetPhase())
	}
	if m, _ := inv.GetMachine(ctx, "m1"); m.GetBmc().GetUsername() != "admin" || m.GetBmc().GetAccountId() != 0 {
		t.Fatalf("machine bmc %v", m.GetBmc())
	}
	if _, _, err := u.PowerState(ctx, Target{Username: "admin", Password: "pw"}); err != nil {
		t.Fatalf("the credential in use: %v", err)
	}
}

// TestRotateRefusals: no accounts driver, an unknown machine. A Redfish
// BMC is rotated like an IPMI one (the driver speaks its AccountService).
func TestRotateRefusals(t *testing.T) {
	inv, _, _, c := newRotation(t, nil)
	ctx := context.Background()
	if _, _, err := c.Rotate(ctx, "nope"); err == nil {
		t.Fatal("an unknown machine was rotated")
	}
	if _, err := inv.UpdateMachine(ctx, "m1", func(m *inventoryv1.Machine) error {
		m.Bmc.Protocol, m.Bmc.TlsInsecure = inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Rotate(ctx, "m1"); err != nil {
		t.Fatalf("Redfish: %v", err)
	}
	c.cfg.Accounts = nil
	if _, _, err := c.Rotate(ctx, "m1"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("no accounts driver: want FailedPrecondition, got %v", err)
	}
}
