package standby

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Prefix holds one StandbyPool record per pool name.
const Prefix = store.StandbyPoolsPrefix

// MaxMinReady bounds a pool's min_ready.
const MaxMinReady = 10000

// eraseLookupTimeout bounds EraseLevel's read of the pool record.
const eraseLookupTimeout = 5 * time.Second

// nameRE is a pool name: what a machine's pool field may hold and a
// selector's pool=NAME can say.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// Service keeps the StandbyPool records. Its methods are safe for
// concurrent use; every write is a compare-and-swap on the record.
type Service struct {
	st  store.Store
	now func() time.Time
	log *slog.Logger
	// changed is poked (never blocking) when a pool is applied or
	// deleted, so the controller of this appliance acts at once.
	changed chan struct{}
}

// NewService returns the pool records' service on st; now and log may be
// nil (time.Now, discard).
func NewService(st store.Store, now func() time.Time, log *slog.Logger) *Service {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{st: st, now: now, log: log, changed: make(chan struct{}, 1)}
}

func newPool() *inventoryv1.StandbyPool { return &inventoryv1.StandbyPool{} }

func checkName(name string) error {
	if name == "" {
		return apierr.Invalidf("standby pool name is required")
	}
	if !nameRE.MatchString(name) {
		return apierr.Invalidf("standby pool name %q is malformed: use 1-63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// Check validates a pool's spec: its name, a min_ready from 0 to
// MaxMinReady, a known readiness, a known erase level and a selector
// inventory parses. Errors are apierr.ErrInvalid naming the field.
func Check(p *inventoryv1.StandbyPool) error {
	if err := checkName(p.GetName()); err != nil {
		return err
	}
	if n := p.GetMinReady(); n < 0 || n > MaxMinReady {
		return apierr.Invalidf("min_ready %d: want 0 to %d", n, MaxMinReady)
	}
	switch p.GetReadiness() {
	case inventoryv1.Readiness_READINESS_POWERED_OFF, inventoryv1.Readiness_READINESS_BOOTED:
	default:
		return apierr.Invalidf("readiness %v: want READINESS_POWERED_OFF or READINESS_BOOTED", p.GetReadiness())
	}
	if _, ok := inventoryv1.EraseLevel_name[int32(p.GetErase())]; !ok {
		return apierr.Invalidf("erase %d: not an erase level", p.GetErase())
	}
	return checkSelector(p)
}

// checkSelector checks the terms a machine of p matches, pool=NAME and
// p's selector, as inventory parses them.
func checkSelector(p *inventoryv1.StandbyPool) error {
	if _, err := inventory.ParseSelectors(rawSelectors(p)); err != nil {
		return apierr.Invalidf("selector %q: %v", p.GetSelector(), err)
	}
	return nil
}

// rawSelectors are p's selector terms as ListMachines takes them.
func rawSelectors(p *inventoryv1.StandbyPool) []string {
	raw := []string{"pool=" + p.GetName()}
	if s := p.GetSelector(); s != "" {
		raw = append(raw, s)
	}
	return raw
}

// Apply creates the pool or replaces its spec (selector, min_ready,
// readiness, erase, auto_accept); its status and times are the
// service's. It returns the record as written.
func (s *Service) Apply(ctx context.Context, p *inventoryv1.StandbyPool) (*inventoryv1.StandbyPool, error) {
	if p == nil {
		return nil, apierr.Invalidf("pool is required")
	}
	if err := Check(p); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.now())
	out, err := record.Update(ctx, s.st, Prefix+p.GetName(), newPool, func(cur *inventoryv1.StandbyPool, exists bool) (bool, error) {
		if !exists {
			cur.Name = p.GetName()
			cur.CreatedAt = now
		}
		cur.Selector = p.GetSelector()
		cur.MinReady = p.GetMinReady()
		cur.Readiness = p.GetReadiness()
		cur.Erase = p.GetErase()
		cur.AutoAccept = p.GetAutoAccept()
		cur.UpdatedAt = now
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("standby pool applied", "pool", out.GetName(), "min_ready", out.GetMinReady(), "readiness", out.GetReadiness().String(), "auto_accept", out.GetAutoAccept())
	s.poke()
	return out, nil
}

// Get returns the pool called name (apierr.ErrNotFound when there is
// none).
func (s *Service) Get(ctx context.Context, name string) (*inventoryv1.StandbyPool, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	p := newPool()
	if _, err := record.Get(ctx, s.st, Prefix+name, p); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("standby pool %q", name)
		}
		return nil, err
	}
	return p, nil
}

// List returns every pool in name order.
func (s *Service) List(ctx context.Context) ([]*inventoryv1.StandbyPool, error) {
	return record.List(ctx, s.st, Prefix, newPool)
}

// Delete removes the pool called name. Its machines are left as they are
// (powered as they were, still in Machine.pool).
func (s *Service) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := record.Update(ctx, s.st, Prefix+name, newPool, func(_ *inventoryv1.StandbyPool, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("standby pool %q", name)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	s.log.Info("standby pool deleted", "pool", name)
	s.poke()
	return nil
}

// EraseLevel is what release does by default for a machine of pool: the
// pool's erase level, ERASE_LEVEL_NONE when there is no such pool, it
// says none (ERASE_LEVEL_DEFAULT), or its record cannot be read within a
// few seconds (logged). It blocks on one store read.
func (s *Service) EraseLevel(pool string) inventoryv1.EraseLevel {
	if pool == "" || checkName(pool) != nil {
		return inventoryv1.EraseLevel_ERASE_LEVEL_NONE
	}
	ctx, cancel := context.WithTimeout(context.Background(), eraseLookupTimeout)
	defer cancel()
	p, err := s.Get(ctx, pool)
	if err != nil {
		if !errors.Is(err, apierr.ErrNotFound) {
			s.log.Warn("standby pool not read: its machines are released without erase", "pool", pool, "err", err)
		}
		return inventoryv1.EraseLevel_ERASE_LEVEL_NONE
	}
	if p.GetErase() == inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT {
		return inventoryv1.EraseLevel_ERASE_LEVEL_NONE
	}
	return p.GetErase()
}

// setStatus writes st as pool name's status by compare-and-swap, unless
// the pool is gone or st says what the record says already (apart from
// observed_at, refreshed at most every statusRefresh). It reports whether
// it wrote.
func (s *Service) setStatus(ctx context.Context, name string, st *inventoryv1.StandbyPoolStatus) (bool, error) {
	wrote := false
	_, err := record.Update(ctx, s.st, Prefix+name, newPool, func(cur *inventoryv1.StandbyPool, exists bool) (bool, error) {
		wrote = false
		if !exists {
			return false, errGone
		}
		if sameStatus(cur.GetStatus(), st) && st.GetObservedAt().AsTime().Sub(cur.GetStatus().GetObservedAt().AsTime()) < statusRefresh {
			return false, errUnchanged
		}
		cur.Status = st
		wrote = true
		return false, nil
	})
	if errors.Is(err, errGone) || errors.Is(err, errUnchanged) {
		return false, nil
	}
	return wrote, err
}

// statusRefresh is how often an unchanged status's observed_at is
// written again.
const statusRefresh = time.Minute

var (
	errGone      = errors.New("pool deleted")
	errUnchanged = errors.New("status unchanged")
)

// sameStatus compares two statuses without observed_at.
func sameStatus(a, b *inventoryv1.StandbyPoolStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := proto.Clone(a).(*inventoryv1.StandbyPoolStatus), proto.Clone(b).(*inventoryv1.StandbyPoolStatus)
	x.ObservedAt, y.ObservedAt = nil, nil
	return proto.Equal(x, y)
}

// poke wakes this appliance's controller without blocking.
func (s *Service) poke() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}
