package standby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/lifecycle"
)

// Controller defaults (kip: the pool loop every 7 s, at most 10 node
// starts an iteration).
const (
	DefaultInterval   = 5 * time.Second
	DefaultMaxActions = 10
	DefaultOffGrace   = 2 * time.Minute
	// minGap spaces passes started by machine changes.
	minGap = 2 * time.Second
	// maxStatusMachines bounds the machine names a pool's status lists.
	maxStatusMachines = 1000
)

// Machines is what the controller needs of the inventory. Implemented by
// *inventory.Inventory.
type Machines interface {
	// ListMachines returns the machines the request selects.
	ListMachines(ctx context.Context, req *inventoryv1.ListMachinesRequest) ([]*inventoryv1.Machine, error)
	// AcceptToPool makes an INVENTORIED machine READY (EventPooled).
	AcceptToPool(ctx context.Context, name string) (*inventoryv1.Machine, error)
}

// Power boots and stops machines. Implemented by *lifecycle.Lifecycle:
// each call claims the machine by compare-and-swap (READY and free) before
// its BMC acts, and fails with lifecycle.ErrNotStandby when it is not.
type Power interface {
	StandbyPowerOn(ctx context.Context, name, by string) error
	StandbyPowerOff(ctx context.Context, name, by string) error
}

// Config configures a Controller.
type Config struct {
	// Pools, Machines and Power are required.
	Pools    *Service
	Machines Machines
	Power    Power
	// Agents reports whether machine's discovery agent has a session open
	// (nil: none ever has).
	Agents func(machine string) bool
	// WatchMachines, when set, streams names of machines that change; a
	// change starts a pass.
	WatchMachines func(ctx context.Context) (<-chan string, error)
	// Interval is the pass period (default DefaultInterval).
	Interval time.Duration
	// MaxActions bounds the accepts and power actions of one pass, over
	// every pool (default DefaultMaxActions).
	MaxActions int
	// OffGrace is how long a READY machine of a powered-off pool may keep
	// its agent session before it is powered off all the same (default
	// DefaultOffGrace).
	OffGrace time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
}

// Controller holds each standby pool at its target. Run it on the fleet's
// leader only (two controllers would both act on what they saw).
type Controller struct {
	cfg Config
	log *slog.Logger
	// seenOn is when a READY machine of a powered-off pool was first seen
	// with its agent connected; offAt when it was last powered off (not
	// again within OffGrace). Only Run's goroutine touches them.
	seenOn map[string]time.Time
	offAt  map[string]time.Time
}

// NewController validates cfg and fills its defaults.
func NewController(cfg Config) (*Controller, error) {
	if cfg.Pools == nil || cfg.Machines == nil || cfg.Power == nil {
		return nil, errors.New("standby: Config.Pools, Machines and Power are required")
	}
	if cfg.Agents == nil {
		cfg.Agents = func(string) bool { return false }
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxActions <= 0 {
		cfg.MaxActions = DefaultMaxActions
	}
	if cfg.OffGrace <= 0 {
		cfg.OffGrace = DefaultOffGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, log: cfg.Logger, seenOn: map[string]time.Time{}, offAt: map[string]time.Time{}}, nil
}

// Run makes a pass every Interval, when a pool is applied on this
// appliance and when a machine changes (WatchMachines), until ctx ends;
// it returns nil then.
func (c *Controller) Run(ctx context.Context) error {
	var changed <-chan string
	var retry <-chan time.Time
	subscribe := func() {
		if c.cfg.WatchMachines == nil {
			return
		}
		ch, err := c.cfg.WatchMachines(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("machine watch unavailable: standby pools act on the tick until it returns", "err", err)
			}
			retry = time.After(time.Second)
			return
		}
		changed, retry = ch, nil
	}
	subscribe()
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	var soon <-chan time.Time
	pass := func() {
		soon = nil
		if err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("standby pass failed", "err", err)
		}
	}
	pass()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry:
			subscribe()
		case _, ok := <-changed:
			if !ok {
				changed = nil
				if ctx.Err() == nil {
					retry = time.After(time.Second)
				}
				continue
			}
			if soon == nil {
				soon = time.After(minGap)
			}
		case <-c.cfg.Pools.changed:
			pass()
		case <-soon:
			pass()
		case <-t.C:
			pass()
		}
	}
}

// Reconcile makes one pass over every pool: auto-accept, power actions
// (at most MaxActions in all) and the status written back to each pool.
// Not safe for concurrent use with itself (Run calls it from one
// goroutine).
func (c *Controller) Reconcile(ctx context.Context) error {
	pools, err := c.cfg.Pools.List(ctx)
	if err != nil {
		return fmt.Errorf("standby pools: %w", err)
	}
	budget := c.cfg.MaxActions
	var errs []error
	for _, p := range pools {
		if ctx.Err() != nil {
			break // the rest wait for the next pass
		}
		st, err := c.pool(ctx, p, &budget)
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.GetName(), err))
			continue
		}
		if _, err := c.cfg.Pools.setStatus(ctx, p.GetName(), st); err != nil {
			errs = append(errs, fmt.Errorf("pool %s status: %w", p.GetName(), err))
		}
	}
	c.forget()
	return errors.Join(errs...)
}

// forget drops power-off memory older than the grace.
func (c *Controller) forget() {
	now := c.cfg.Now()
	for k, t := range c.offAt {
		if now.Sub(t) > c.cfg.OffGrace {
			delete(c.offAt, k)
		}
	}
}

// view is one pool's machines as a pass sees them.
type view struct {
	ready, inventoried []*inventoryv1.Machine
	booted, booting    []*inventoryv1.Machine
	idle               []*inventoryv1.Machine // READY, neither booted nor booting
	allocated          int
	// readyNames names the READY machines.
	readyNames []string
}

func (c *Controller) look(ms []*inventoryv1.Machine) view {
	var v view
	for _, m := range ms {
		switch {
		case allocated(m):
			v.allocated++
		case m.GetState() == inventoryv1.Machine_READY:
			v.ready = append(v.ready, m)
			v.readyNames = append(v.readyNames, m.GetName())
			switch {
			case c.cfg.Agents(m.GetName()):
				v.booted = append(v.booted, m)
			case m.GetWatchdog().GetArmedAt() != nil:
				v.booting = append(v.booting, m)
			default:
				v.idle = append(v.idle, m)
			}
		case m.GetState() == inventoryv1.Machine_INVENTORIED:
			v.inventoried = append(v.inventoried, m)
		}
	}
	return v
}

// allocated reports whether m is held by an owner.
func allocated(m *inventoryv1.Machine) bool {
	a := m.GetAllocation()
	return a != nil && a.GetReleasedAt() == nil
}

// pool makes one pass over p and returns its status.
func (c *Controller) pool(ctx context.Context, p *inventoryv1.StandbyPool, budget *int) (*inventoryv1.StandbyPoolStatus, error) {
	if err := checkSelector(p); err != nil {
		return nil, err
	}
	ms, err := c.cfg.Machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{
		Selectors: rawSelectors(p), View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY,
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ms, func(a, b *inventoryv1.Machine) int { return strings.Compare(a.GetName(), b.GetName()) })
	name := p.GetName()
	by := "standby pool " + name
	target := int(p.GetMinReady())
	st := &inventoryv1.StandbyPoolStatus{
		LastAction: p.GetStatus().GetLastAction(), LastActionAt: p.GetStatus().GetLastActionAt(),
		ObservedAt: timestamppb.New(c.cfg.Now()),
	}
	did := func(what string) {
		*budget--
		st.LastAction, st.LastActionAt = what, timestamppb.New(c.cfg.Now())
		c.log.Info("standby: "+what, "pool", name)
	}
	cond := func(format string, a ...any) { st.Conditions = append(st.Conditions, fmt.Sprintf(format, a...)) }
	v := c.look(ms)

	// Auto-accept: INVENTORIED machines of the pool up to the target.
	var accepted []string
	if short := target - len(v.ready); short > 0 && p.GetAutoAccept() {
		if len(v.inventoried) == 0 {
			cond("%d READY short and no INVENTORIED machine of the pool matches", short)
		}
		for _, m := range v.inventoried {
			if short == 0 || *budget <= 0 {
				break
			}
			am, err := c.cfg.Machines.AcceptToPool(ctx, m.GetName())
			if err != nil {
				if !errors.Is(err, apierr.ErrPrecondition) {
					cond("%s not accepted: %v", m.GetName(), err)
				}
				continue
			}
			short--
			accepted = append(accepted, am.GetName())
			v.ready = append(v.ready, am)
			v.idle = append(v.idle, am)
			did("accepted " + m.GetName())
		}
	}

	switch p.GetReadiness() {
	case inventoryv1.Readiness_READINESS_BOOTED:
		c.holdBooted(ctx, &v, target, by, budget, did, cond)
	case inventoryv1.Readiness_READINESS_POWERED_OFF:
		c.holdOff(ctx, &v, by, budget, did, cond)
	case inventoryv1.Readiness_READINESS_UNSPECIFIED:
		// Apply refuses it; a record without one is never powered.
		cond("no readiness: no machine is powered on or off")
	}

	inMode := len(v.ready)
	if p.GetReadiness() == inventoryv1.Readiness_READINESS_BOOTED {
		inMode = len(v.booted)
	}
	st.Ready = int32(len(v.ready))
	st.Booted = int32(len(v.booted))
	if p.GetReadiness() == inventoryv1.Readiness_READINESS_BOOTED {
		st.Warming = int32(len(v.booting))
	}
	v.readyNames = append(v.readyNames, accepted...)
	slices.Sort(v.readyNames)
	st.ReadyMachines = v.readyNames[:min(len(v.readyNames), maxStatusMachines)]
	st.Allocated = int32(v.allocated)
	st.Deficit = int32(max(0, target-inMode))
	if *budget <= 0 {
		cond("power actions for this pass used up (%d a pass): the rest wait for the next", c.cfg.MaxActions)
	}
	return st, nil
}

// holdBooted keeps target READY machines booted into discovery (or on
// their way) and powers the READY machines beyond them off.
func (c *Controller) holdBooted(ctx context.Context, v *view, target int, by string, budget *int, did func(string), cond func(string, ...any)) {
	up := len(v.booted) + len(v.booting)
	for _, m := range v.idle {
		if up >= target || *budget <= 0 {
			break
		}
		if m.GetBmc().GetAddress() == "" {
			cond("%s has no BMC: cannot power it on", m.GetName())
			continue
		}
		err := c.cfg.Power.StandbyPowerOn(ctx, m.GetName(), by)
		if err != nil {
			if !lifecycle.IsNotStandby(err) {
				cond("%s not powered on: %v", m.GetName(), err)
			}
			continue
		}
		up++
		v.booting = append(v.booting, m)
		did("powered on " + m.GetName() + " into discovery")
	}
	v.idle = slices.DeleteFunc(v.idle, func(m *inventoryv1.Machine) bool { return slices.Contains(v.booting, m) })
	// Beyond the target: the booting first, then the booted, last by name
	// first; idle machines the BMC poller reads ON too.
	extra := up - target
	surplus := append(slices.Clone(v.booting), v.booted...)
	slices.Reverse(surplus)
	for _, m := range surplus {
		if extra <= 0 || *budget <= 0 {
			break
		}
		if c.off(ctx, m, by, did, cond) {
			extra--
		}
	}
	for _, m := range v.idle {
		if up < target || *budget <= 0 {
			break
		}
		if m.GetPowerState() == inventoryv1.PowerState_POWER_STATE_ON {
			c.off(ctx, m, by, did, cond)
		}
	}
}

// holdOff powers off READY machines: at once when no agent session is
// open (the BMC reads them ON), after OffGrace while one is.
func (c *Controller) holdOff(ctx context.Context, v *view, by string, budget *int, did func(string), cond func(string, ...any)) {
	now := c.cfg.Now()
	for _, m := range v.ready {
		if *budget <= 0 {
			return
		}
		name := m.GetName()
		connected := c.cfg.Agents(name)
		if !connected {
			delete(c.seenOn, name)
		}
		if m.GetPowerState() != inventoryv1.PowerState_POWER_STATE_ON && !connected {
			continue
		}
		if connected {
			first, ok := c.seenOn[name]
			if !ok {
				c.seenOn[name] = now
				continue
			}
			if now.Sub(first) < c.cfg.OffGrace {
				continue
			}
		}
		if t, ok := c.offAt[name]; ok && now.Sub(t) < c.cfg.OffGrace {
			continue // powered off already; the BMC poller has not read it yet
		}
		c.off(ctx, m, by, did, cond)
	}
}

// off powers m off and reports whether it did.
func (c *Controller) off(ctx context.Context, m *inventoryv1.Machine, by string, did func(string), cond func(string, ...any)) bool {
	if m.GetBmc().GetAddress() == "" {
		cond("%s has no BMC: cannot power it off", m.GetName())
		return false
	}
	if err := c.cfg.Power.StandbyPowerOff(ctx, m.GetName(), by); err != nil {
		if !lifecycle.IsNotStandby(err) {
			cond("%s not powered off: %v", m.GetName(), err)
		}
		return false
	}
	c.offAt[m.GetName()] = c.cfg.Now()
	delete(c.seenOn, m.GetName())
	did("powered off " + m.GetName())
	return true
}
