package bmc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Account is a BMC user account (docs/architecture.md, "BMC credentials
// Corral owns"). Password lives only in memory.
type Account struct {
	// ID is the BMC's user slot; 0 lets the BMC side choose one.
	ID       uint32
	Name     string
	Password string
}

// Accounts is what credential rotation needs of the BMCs beyond Driver;
// cmd wires the ipmi package to it. Errors are classified as Driver's.
type Accounts interface {
	// NewPassword returns a random password the BMC stores whole.
	NewPassword() string
	// SetAccount makes a on the BMC with t's credentials (the slot named
	// a.Name, or a free one; never t's own) with administrator access,
	// enabled, and returns its slot.
	SetAccount(ctx context.Context, t Target, a Account) (uint32, Result, error)
	// DisableAccount disables slot id (not t's own) and scrambles its
	// password.
	DisableAccount(ctx context.Context, t Target, id uint32) (Result, error)
}

// DefaultAccountNames are the two names Corral's own account alternates
// between, so that a new password is proven on one account while the
// other still logs in.
var DefaultAccountNames = [2]string{"corral-a", "corral-b"}

// rotation phases as the machine record shows them (Bmc.rotation).
var phaseName = map[inventoryv1.BmcRotationPhase]string{
	inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_PENDING:  "pending",
	inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_SET:      "set",
	inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED: "verified",
}

// errRotationMoved: the secret's phase is not the one a step expected
// (another appliance, or an enrolment, changed it).
var errRotationMoved = apierr.New(apierr.ErrConflict, "the BMC credential rotation was changed by someone else meanwhile: run it again")

// rotationLocks serialises rotations of one machine on one appliance;
// across appliances each step is a compare-and-swap on the phase.
type rotationLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *rotationLocks) lock(name string) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sync.Mutex{}
	}
	mu := l.m[name]
	if mu == nil {
		mu = &sync.Mutex{}
		l.m[name] = mu
	}
	l.mu.Unlock()
	mu.Lock()
	return mu.Unlock
}

// rotation is one machine's rotation as it runs: what it did so far.
type rotation struct {
	c     *Service
	name  string
	steps []string
}

func (r *rotation) step(format string, args ...any) {
	r.steps = append(r.steps, fmt.Sprintf(format, args...))
}

// crash is the test hook of Config.Crash: an error stops the rotation
// at that point as if the appliance had died there.
func (r *rotation) crash(at string) error {
	if r.c.cfg.Crash == nil {
		return nil
	}
	if err := r.c.cfg.Crash(r.name, at); err != nil {
		return fmt.Errorf("rotation of %s stopped after %s: %w", r.name, at, err)
	}
	return nil
}

// Rotate gives Corral's own BMC account on machine name a new random
// password, making the account the first time (docs/architecture.md,
// "BMC credentials Corral owns"). The order never locks the machine out:
//
//  1. pending: the new password is sealed into the machine's secret record
//     (compare-and-swap), beside the one in use, before the BMC hears it;
//  2. the BMC is told (with the credential in use) to set the account
//     that is not in use — the other of the two names — and the phase
//     becomes set;
//  3. a call logged in with the new credential must answer: verified;
//  4. committed: in one transaction the machine's user name and the
//     sealed password become the new ones;
//  5. the account used before is disabled on the BMC (not the one the
//     machine was enrolled with: that one is the operator's).
//
// A rotation left unfinished (the appliance died) is finished first:
// the pending credential is tried, then the old one. Steps say what was
// done; passwords appear nowhere.
func (c *Service) Rotate(ctx context.Context, name string) (*inventoryv1.Machine, []string, error) {
	if c.cfg.Accounts == nil {
		return nil, nil, apierr.Preconditionf("BMC credential rotation is not available on this appliance")
	}
	defer c.locks.lock(name)()
	r := &rotation{c: c, name: name}
	m, err := r.resume(ctx)
	if err != nil {
		return m, r.steps, err
	}
	m, err = r.fresh(ctx)
	return m, r.steps, err
}

// ResumeRotations finishes the rotations an appliance left unfinished
// (machines whose secret is not at phase none), each as Rotate's first
// step does; keep says which machines this appliance owns (nil: all).
// Failures are logged; it returns how many it finished.
func (c *Service) ResumeRotations(ctx context.Context, keep func(machine string) bool) int {
	if c.cfg.Accounts == nil {
		return 0
	}
	kvs, err := c.cfg.Store.List(ctx, bmcSecretPrefix)
	if err != nil {
		c.log.Warn("BMC rotations: listing secrets failed", "err", err)
		return 0
	}
	done := 0
	for _, kv := range kvs {
		name := strings.TrimPrefix(kv.Key, bmcSecretPrefix)
		var sec inventoryv1.BmcSecret
		if err := record.Unmarshal(kv.Value, &sec); err != nil || sec.GetPhase() == inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE {
			continue
		}
		if keep != nil && !keep(name) {
			continue
		}
		unlock := c.locks.lock(name)
		r := &rotation{c: c, name: name}
		_, err := r.resume(ctx)
		unlock()
		if err != nil {
			c.log.Warn("BMC rotation left unfinished could not be finished", "machine", name, "steps", r.steps, "err", err)
			continue
		}
		c.log.Info("BMC rotation left unfinished finished", "machine", name, "steps", r.steps)
		done++
	}
	return done
}

// secret reads the machine's secret record.
func (r *rotation) secret(ctx context.Context) (*inventoryv1.BmcSecret, error) {
	var sec inventoryv1.BmcSecret
	if _, err := record.Get(ctx, r.c.cfg.Store, bmcSecretPrefix+r.name, &sec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.Preconditionf("machine %q has no stored BMC password: enroll it", r.name)
		}
		return nil, err
	}
	return &sec, nil
}

// advance moves the rotation from one of the phases in from by changing
// the secret (change) and the machine (mutate) in one transaction: a
// compare-and-swap on both.
func (r *rotation) advance(ctx context.Context, from []inventoryv1.BmcRotationPhase, change func(sec *inventoryv1.BmcSecret), mutate func(b *inventoryv1.Bmc)) (*inventoryv1.Machine, error) {
	ctx = context.WithoutCancel(ctx) // a step the BMC took is recorded
	return r.c.inv.UpdateMachineWith(ctx, r.name, func(m *inventoryv1.Machine) error {
		if m.GetBmc().GetUsername() == "" {
			return apierr.Preconditionf("machine %q has no enrolled BMC", r.name)
		}
		mutate(m.Bmc)
		return nil
	}, func(tx *record.Tx, _ *inventoryv1.Machine) error {
		var sec inventoryv1.BmcSecret
		exists, err := tx.Get(ctx, bmcSecretPrefix+r.name, &sec)
		if err != nil {
			return err
		}
		ok := false
		for _, p := range from {
			ok = ok || sec.GetPhase() == p
		}
		if !exists || !ok {
			return errRotationMoved
		}
		change(&sec)
		return tx.Put(bmcSecretPrefix+r.name, &sec)
	})
}

func clearPending(sec *inventoryv1.BmcSecret) {
	sec.PendingSealedPassword, sec.PendingUsername, sec.PendingAccountId, sec.PendingSince = nil, "", 0, nil
}

// fresh runs a rotation from phase none.
func (r *rotation) fresh(ctx context.Context) (*inventoryv1.Machine, error) {
	c := r.c
	m, old, err := c.target(ctx, r.name)
	if err != nil {
		return m, err
	}
	names := c.cfg.AccountNames
	newName := names[0]
	if old.Username == names[0] {
		newName = names[1]
	}
	pw := c.cfg.Accounts.NewPassword()
	sealed, err := c.cfg.Sealer.Seal([]byte(pw), []byte(r.name))
	if err != nil {
		return m, fmt.Errorf("seal BMC password: %w", err)
	}
	oldID := m.GetBmc().GetAccountId()
	none := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE}
	m, err = r.advance(ctx, none, func(sec *inventoryv1.BmcSecret) {
		sec.Phase = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_PENDING
		sec.PendingSealedPassword, sec.PendingUsername, sec.PendingSince = sealed, newName, timestamppb.New(c.cfg.Now())
	}, func(b *inventoryv1.Bmc) { b.Rotation = "pending" })
	if err != nil {
		return m, err
	}
	r.step("sealed a new password for %q (pending)", newName)
	if err := r.crash("pending"); err != nil {
		return m, err
	}
	cctx, cancel := context.WithTimeout(ctx, old.Timeout)
	id, _, err := c.cfg.Accounts.SetAccount(cctx, old, Account{Name: newName, Password: pw})
	cancel()
	if err != nil {
		// The account in use was not touched: it still logs in.
		r.abandon(ctx, "the BMC refused the new account")
		return m, fmt.Errorf("rotate %s: set BMC account %q: %w", r.name, newName, err)
	}
	r.step("set user %d %q on the BMC", id, newName)
	if err := r.crash("bmc-set"); err != nil {
		return m, err
	}
	pending := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_PENDING}
	m, err = r.advance(ctx, pending, func(sec *inventoryv1.BmcSecret) {
		sec.Phase, sec.PendingAccountId = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_SET, id
	}, func(b *inventoryv1.Bmc) { b.Rotation = "set" })
	if err != nil {
		return m, err
	}
	if err := r.crash("set"); err != nil {
		return m, err
	}
	nt := old
	nt.Username, nt.Password = newName, pw
	res, err := r.verify(ctx, nt)
	if err != nil {
		r.abandon(ctx, "the new credential did not log in")
		// The stray account goes; the one in use still logs in.
		dctx, cancel := context.WithTimeout(ctx, old.Timeout)
		if _, derr := c.cfg.Accounts.DisableAccount(dctx, old, id); derr != nil {
			// It holds a password nobody keeps; the next rotation takes
			// the slot again.
			c.log.Warn("BMC rotation: the account that did not log in could not be disabled", "machine", r.name, "account", newName, "err", derr)
		}
		cancel()
		return m, fmt.Errorf("rotate %s: the BMC set account %q but does not log it in (the credential in use is kept): %w", r.name, newName, err)
	}
	m, err = r.verified(ctx)
	if err != nil {
		return m, err
	}
	return r.commit(ctx, id, newName, oldID, res)
}

// verify logs in with t (a few tries: some BMCs take a moment to apply
// a new account).
func (r *rotation) verify(ctx context.Context, t Target) (Result, error) {
	var err error
	var res Result
	for try := range 3 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(time.Second):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, t.Timeout)
		_, res, err = r.c.cfg.Driver.PowerState(cctx, t)
		cancel()
		if err == nil {
			return res, nil
		}
	}
	return res, err
}

// verified records that the new credential logged in.
func (r *rotation) verified(ctx context.Context) (*inventoryv1.Machine, error) {
	set := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_SET}
	m, err := r.advance(ctx, set, func(sec *inventoryv1.BmcSecret) {
		sec.Phase = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED
	}, func(b *inventoryv1.Bmc) { b.Rotation = "verified" })
	if err != nil {
		return m, err
	}
	r.step("verified: the new credential logs in")
	if err := r.crash("verified"); err != nil {
		return m, err
	}
	return m, nil
}

// commit makes the new credential the machine's and then drops the
// account used before (dropID, 0 for none).
func (r *rotation) commit(ctx context.Context, id uint32, newName string, dropID uint32, res Result) (*inventoryv1.Machine, error) {
	c := r.c
	if dropID == id {
		dropID = 0
	}
	now := timestamppb.New(c.cfg.Now())
	verified := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED}
	m, err := r.advance(ctx, verified, func(sec *inventoryv1.BmcSecret) {
		sec.SealedPassword = sec.PendingSealedPassword
		clearPending(sec)
		sec.Phase = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_COMMITTED
		sec.PendingAccountId = dropID // the account to drop next
	}, func(b *inventoryv1.Bmc) {
		b.Username, b.AccountId, b.RotatedAt, b.VerifiedAt, b.Rotation = newName, id, now, now, ""
		if res.Provider != "" {
			b.Provider = res.Provider
		}
	})
	if err != nil {
		return m, err
	}
	r.step("committed: the machine logs in as %q (user %d)", newName, id)
	c.event(m, "bmc-rotated", fmt.Sprintf("BMC credential rotated: user %d %q, password sealed", id, newName), res)
	c.log.Info("BMC credential rotated", "machine", r.name, "user", newName, "account", id)
	if err := r.crash("committed"); err != nil {
		return m, err
	}
	return r.drop(ctx, m)
}

// drop disables the account a committed rotation left behind and ends
// the rotation. A failure leaves it committed, for the next resume.
func (r *rotation) drop(ctx context.Context, m *inventoryv1.Machine) (*inventoryv1.Machine, error) {
	c := r.c
	sec, err := r.secret(ctx)
	if err != nil {
		return m, err
	}
	if id := sec.GetPendingAccountId(); id != 0 {
		m2, t, err := c.target(ctx, r.name)
		if err != nil {
			return m, err
		}
		m = m2
		cctx, cancel := context.WithTimeout(ctx, t.Timeout)
		_, err = c.cfg.Accounts.DisableAccount(cctx, t, id)
		cancel()
		if err != nil {
			r.step("the account used before (user %d) is not disabled yet: %v", id, err)
			c.log.Warn("BMC rotation: the account used before is not disabled yet", "machine", r.name, "account", id, "err", err)
			return m, nil
		}
		r.step("disabled user %d, the account used before", id)
	}
	committed := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_COMMITTED}
	return r.advance(ctx, committed, func(sec *inventoryv1.BmcSecret) {
		sec.Phase, sec.PendingAccountId = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE, 0
	}, func(b *inventoryv1.Bmc) { b.Rotation = "" })
}

// abandon ends a rotation whose new credential is not (or not known to
// be) on the BMC: the pending password is forgotten; the one in use
// stays.
func (r *rotation) abandon(ctx context.Context, why string) {
	phases := []inventoryv1.BmcRotationPhase{inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_PENDING,
		inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_SET, inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED}
	_, err := r.advance(ctx, phases, func(sec *inventoryv1.BmcSecret) {
		clearPending(sec)
		sec.Phase = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE
	}, func(b *inventoryv1.Bmc) { b.Rotation = "" })
	if err != nil {
		r.c.log.Warn("BMC rotation could not be abandoned", "machine", r.name, "err", err)
		return
	}
	r.step("abandoned: %s; the credential in use is kept", why)
}

// resume finishes a rotation left unfinished, if there is one: the
// pending credential is tried first (the BMC may have it), then the one
// in use. Neither logging in keeps both, and is an error.
func (r *rotation) resume(ctx context.Context) (*inventoryv1.Machine, error) {
	c := r.c
	sec, err := r.secret(ctx)
	if err != nil {
		return nil, err
	}
	phase := sec.GetPhase()
	if phase == inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_NONE {
		return nil, nil
	}
	m, old, err := c.target(ctx, r.name)
	if err != nil {
		return m, err
	}
	if phase == inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_COMMITTED {
		r.step("resumed a rotation left committed")
		return r.drop(ctx, m)
	}
	r.step("resumed a rotation left at phase %s", phaseName[phase])
	pw, serr := c.cfg.Sealer.Open(sec.GetPendingSealedPassword(), []byte(r.name))
	if serr != nil {
		// It never reached the BMC in a form Corral can use: the
		// credential in use stays.
		r.abandon(ctx, "the pending password cannot be opened")
		return m, nil //nolint:nilerr // abandoning is the recovery
	}
	nt := old
	nt.Username, nt.Password = sec.GetPendingUsername(), string(pw)
	cctx, cancel := context.WithTimeout(ctx, nt.Timeout)
	_, res, perr := c.cfg.Driver.PowerState(cctx, nt)
	cancel()
	if perr == nil {
		r.step("the pending credential %q logs in", nt.Username)
		oldID := m.GetBmc().GetAccountId()
		id := sec.GetPendingAccountId()
		if id == 0 {
			// Died before the slot was recorded: ask the BMC (with the
			// new credential, setting the same account again).
			sctx, cancel := context.WithTimeout(ctx, nt.Timeout)
			id, _, err = c.cfg.Accounts.SetAccount(sctx, old, Account{Name: nt.Username, Password: nt.Password})
			cancel()
			if err != nil {
				return m, fmt.Errorf("rotate %s: the pending account logs in, but its slot is unknown: %w", r.name, err)
			}
		}
		if phase != inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED {
			m, err = r.advance(ctx, []inventoryv1.BmcRotationPhase{phase}, func(sec *inventoryv1.BmcSecret) {
				sec.Phase, sec.PendingAccountId = inventoryv1.BmcRotationPhase_BMC_ROTATION_PHASE_VERIFIED, id
			}, func(b *inventoryv1.Bmc) { b.Rotation = "verified" })
			if err != nil {
				return m, err
			}
		}
		return r.commit(ctx, id, nt.Username, oldID, res)
	}
	cctx, cancel = context.WithTimeout(ctx, old.Timeout)
	_, _, oerr := c.cfg.Driver.PowerState(cctx, old)
	cancel()
	if oerr == nil {
		r.abandon(ctx, "the pending credential does not log in and the one in use does")
		return m, nil
	}
	return m, apierr.Unavailablef("machine %q: a BMC credential rotation was left at phase %s and neither credential logs in now (both are kept; try again when the BMC answers): pending: %v; in use: %v",
		r.name, phaseName[phase], perr, oerr)
}

// RotateDue rotates, one after the other, the machines whose BMC account
// Corral owns (rotated once: an operator opted them in) and whose
// password is older than every; keep says which machines this appliance
// owns (nil: all). Failures are logged and leave the machine as it was
// (or its rotation for the next resume). It returns how many it rotated.
func (c *Service) RotateDue(ctx context.Context, every time.Duration, keep func(machine string) bool) int {
	if c.cfg.Accounts == nil || every <= 0 {
		return 0
	}
	ms, err := c.inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
	if err != nil {
		c.log.Warn("scheduled BMC rotation: listing machines failed", "err", err)
		return 0
	}
	now := c.cfg.Now()
	n := 0
	for _, m := range ms {
		b := m.GetBmc()
		if b.GetAccountId() == 0 || b.GetRotatedAt() == nil || now.Sub(b.GetRotatedAt().AsTime()) < every || (keep != nil && !keep(m.GetName())) {
			continue
		}
		if ctx.Err() != nil {
			return n
		}
		if _, steps, err := c.Rotate(ctx, m.GetName()); err != nil {
			c.log.Warn("scheduled BMC rotation failed", "machine", m.GetName(), "steps", steps, "err", err)
			continue
		}
		n++
	}
	return n
}
