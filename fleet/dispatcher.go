package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Dispatcher is the leader's dispatch of per-machine work. Run it only on
// the leader. It gives every machine without a live runner to one:
// affinity first (a runner whose BMC networks contain the machine's BMC
// address and whose boot segments contain its last boot address; an empty
// list admits anything), then the least assigned, ties by name. A
// machine's assignment stays with its runner while that runner is live,
// unless the runner's networks exclude the machine and another live
// runner's admit it. A runner that stops heartbeating for Expiry, or
// deletes its record, has its machines re-dispatched; assignments of
// machines that no longer exist are deleted. Every write is a
// compare-and-swap.
//
// Runners, machines and assignments are followed through store watches,
// so a new machine or a runner leaving is dispatched within a fraction of
// a second; Interval bounds how late an expiry is noticed when nothing
// changes (the dispatcher also wakes at the earliest runner expiry).
type Dispatcher struct {
	Store store.Store
	// Self is this appliance's name, written as each assignment's leader.
	Self string
	// Expiry is how long a runner stays live after its last heartbeat
	// (default DefaultExpiry).
	Expiry time.Duration
	// Interval is the longest the dispatcher sleeps (default
	// DefaultDispatchInterval).
	Interval time.Duration
	Logger   *slog.Logger
	// Now is the clock liveness is judged by (default time.Now). Runner
	// heartbeats carry their appliance's clock: keep the fleet's clocks
	// synchronised (NTP), skew eats into Expiry.
	Now func() time.Time
	// MaxMachines bounds the machines and assignments kept in memory
	// (default DefaultMaxMachines). Past it, the rest are not dispatched
	// and no assignment is deleted.
	MaxMachines int
	// Concurrency bounds the assignment writes in flight (default 32:
	// etcd batches concurrent writes; 5,000 assignments take ~3.6 s on a
	// loopback 3-member cluster, ~8 s at 8).
	Concurrency int

	mu   sync.Mutex
	redo []Redispatch // the last maxRedispatches, oldest first
}

// Redispatch is one runner's machines moving to other runners because the
// runner expired or left.
type Redispatch struct {
	// Runner is the runner that lost its machines.
	Runner string
	// Left says the runner deleted its record (a graceful stop); otherwise
	// it expired.
	Left bool
	// Machines counts the assignments re-written.
	Machines int
	// LastHeartbeat is the runner's last heartbeat as this dispatcher saw
	// it (zero when it never saw one).
	LastHeartbeat time.Time
	// At is when the assignments had been written.
	At time.Time
	// After is At - LastHeartbeat: how long the runner's machines had no
	// live runner, as far as the dispatcher knows (0 when unknown).
	After time.Duration
}

const maxRedispatches = 64

// Redispatches returns the most recent re-dispatches (up to 64), oldest
// first. Safe for concurrent use.
func (d *Dispatcher) Redispatches() []Redispatch {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.redo)
}

func (d *Dispatcher) noteRedispatch(r Redispatch) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.redo) >= maxRedispatches {
		d.redo = slices.Delete(d.redo, 0, len(d.redo)-maxRedispatches+1)
	}
	d.redo = append(d.redo, r)
}

func (d *Dispatcher) fill() error {
	if d.Store == nil {
		return errors.New("fleet: Dispatcher.Store is required")
	}
	if err := CheckName(d.Self); err != nil {
		return err
	}
	if d.Expiry <= 0 {
		d.Expiry = DefaultExpiry
	}
	if d.Interval <= 0 {
		d.Interval = DefaultDispatchInterval
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.MaxMachines <= 0 {
		d.MaxMachines = DefaultMaxMachines
	}
	if d.Concurrency <= 0 {
		d.Concurrency = 32
	}
	return nil
}

// machineInfo is what dispatch needs of a machine record.
type machineInfo struct {
	bmc     netip.Addr // invalid: none, or a host name
	bootMAC string
}

func decodeMachine(b []byte) (machineInfo, error) {
	var m inventoryv1.Machine
	if err := record.Unmarshal(b, &m); err != nil {
		return machineInfo{}, err
	}
	mi := machineInfo{bootMAC: m.GetBootMac()}
	if a, err := netip.ParseAddr(m.GetBmc().GetAddress()); err == nil {
		mi.bmc = a.Unmap()
	}
	return mi, nil
}

func decodeAppliance(b []byte) (*fleetv1.Appliance, error) {
	a := &fleetv1.Appliance{}
	return a, record.Unmarshal(b, a)
}

func decodeAssignment(b []byte) (*fleetv1.Assignment, error) {
	a := &fleetv1.Assignment{}
	return a, record.Unmarshal(b, a)
}

// dispatch is one leadership term's state, owned by Run's goroutine but
// for the mirrors, which have their own.
type dispatch struct {
	d        *Dispatcher
	log      *slog.Logger
	runners  *mirror[*fleetv1.Appliance]
	machines *mirror[machineInfo]
	assigns  *mirror[*fleetv1.Assignment]
	changed  chan struct{}

	// lastBeat is each runner's last heartbeat seen, kept after its
	// record is gone while it still holds assignments.
	lastBeat map[string]time.Time
	// waiting is set while machines wait for a live runner (logged once).
	waiting  bool
	failures lograte.Counter

	// leases caches MAC -> last boot address (full-mode DHCP leases).
	leases   map[string]netip.Addr
	leasesAt time.Time
}

func (d *Dispatcher) newDispatch() *dispatch {
	log := d.Logger.With("component", "dispatcher")
	s := &dispatch{d: d, log: log, changed: make(chan struct{}, 1), lastBeat: map[string]time.Time{}}
	s.runners = newMirror(d.Store, AppliancePrefix, "appliance", maxAppliances, log, decodeAppliance)
	s.machines = newMirror(d.Store, MachinePrefix, "machine", d.MaxMachines, log, decodeMachine)
	s.assigns = newMirror(d.Store, AssignmentPrefix, "assignment", d.MaxMachines, log, decodeAssignment)
	s.runners.changed, s.machines.changed, s.assigns.changed = s.changed, s.changed, s.changed
	// A machine matters when it appears, goes, or its addresses change;
	// power polls rewrite machine records constantly and do not.
	s.machines.matters = func(prev item[machineInfo], had bool, next item[machineInfo], has bool) bool {
		return had != has || prev.v != next.v || prev.bad != next.bad
	}
	// Assignments written by this dispatcher come back through the watch:
	// only someone else's write (another leader's) is news.
	s.assigns.matters = func(prev item[*fleetv1.Assignment], had bool, next item[*fleetv1.Assignment], has bool) bool {
		return !has || next.bad || next.v.GetLeader() != d.Self
	}
	return s
}

// settle is how long a wake-up by a change waits for more changes, so a
// burst (many machines discovered at once) is dispatched in one pass.
const settle = 100 * time.Millisecond

// Run dispatches until ctx ends (this appliance stops leading), then
// returns nil. It returns an error only for an invalid configuration. It
// may be called again after it returns (a new leadership term).
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.fill(); err != nil {
		return err
	}
	s := d.newDispatch()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = s.runners.run(ctx) })
	wg.Go(func() { _ = s.machines.run(ctx) })
	wg.Go(func() { _ = s.assigns.run(ctx) })
	for _, wait := range []func(context.Context) error{s.runners.wait, s.machines.wait, s.assigns.wait} {
		if wait(ctx) != nil {
			return nil
		}
	}
	s.log.Info("dispatching per-machine work", "expiry", d.Expiry.String(), "interval", d.Interval.String())
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-s.changed:
			t := time.NewTimer(settle)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			select {
			case <-s.changed:
			default:
			}
		}
		timer.Reset(s.pass(ctx))
	}
}

// op is one assignment write (del: delete) planned by a pass.
type op struct {
	machine string
	a       *fleetv1.Assignment
	rev     int64
	del     bool
	// from is the runner the machine leaves ("" for a new machine); left
	// says that runner deleted its record; moved says it is live but its
	// networks exclude the machine.
	from  string
	left  bool
	moved bool
	ok    bool
}

// pass looks at runners, machines and assignments once, writes what
// changed, and returns how long to sleep before the next look.
func (s *dispatch) pass(ctx context.Context) time.Duration {
	d := s.d
	now := d.Now()
	runners, _ := s.runners.snapshot()
	machines, truncated := s.machines.snapshot()
	assigns, _ := s.assigns.snapshot()

	live := map[string]*candidate{}
	var cands []*candidate
	for name, it := range runners {
		if it.bad {
			continue
		}
		if hb := it.v.GetLastHeartbeat(); hb != nil {
			s.lastBeat[name] = hb.AsTime()
		}
		if !Live(it.v, now, d.Expiry) {
			continue
		}
		c := &candidate{name: name, bmcNets: lenientNets(it.v.GetBmcNetworks()), bootSegs: lenientNets(it.v.GetBootSegments())}
		live[name] = c
		cands = append(cands, c)
	}
	slices.SortFunc(cands, func(a, b *candidate) int { return cmp.Compare(a.name, b.name) })
	holder := func(m string) *candidate {
		if a, ok := assigns[m]; ok && !a.bad {
			return live[a.v.GetRunner()]
		}
		return nil
	}
	for m := range machines {
		if c := holder(m); c != nil {
			c.assigned++
		}
	}
	var boots map[string]netip.Addr
	if slices.ContainsFunc(cands, func(c *candidate) bool { return len(c.bootSegs) > 0 }) {
		boots = s.bootAddrs(ctx, now, machines)
	}

	names := make([]string, 0, len(machines))
	for m := range machines {
		names = append(names, m)
	}
	slices.Sort(names)
	var ops []*op
	waiting := 0
	for _, m := range names {
		mi := machines[m].v
		t := target{bmc: mi.bmc, boot: boots[mi.bootMAC]}
		prev, hadPrev := assigns[m]
		from, why := "", ""
		if c := holder(m); c != nil {
			// Live: stays, unless its networks exclude the machine and
			// another live runner's admit it.
			if ok, _, _ := c.match(t); ok || !admitted(cands, t) {
				continue
			}
			c.assigned--
			from, why = c.name, fmt.Sprintf("runner %s's networks do not contain %s: moved", c.name, describeTarget(t))
		} else if hadPrev && !prev.bad {
			from = prev.v.GetRunner()
		}
		if len(cands) == 0 {
			waiting++
			continue
		}
		o := &op{machine: m, from: from, moved: why != ""}
		if hadPrev {
			o.rev = prev.rev
		}
		if from != "" && why == "" {
			if r, ok := runners[from]; ok {
				exp := "never heartbeated"
				if hb := r.v.GetLastHeartbeat(); hb != nil && !r.bad {
					exp = "expired at " + hb.AsTime().Add(d.Expiry).UTC().Format(time.RFC3339)
				}
				why = fmt.Sprintf("runner %s %s: re-dispatched", from, exp)
			} else {
				o.left = true
				why = fmt.Sprintf("runner %s left: re-dispatched", from)
			}
		}
		c, reason := place(cands, t)
		if why != "" {
			reason = why + "; " + reason
		}
		o.a = &fleetv1.Assignment{Machine: m, Runner: c.name, AssignedAt: timestamppb.New(now), Reason: reason, Leader: d.Self}
		ops = append(ops, o)
	}
	switch {
	case waiting > 0 && !s.waiting:
		s.log.Warn("no live runner: machines wait for one", "machines", waiting)
		s.waiting = true
	case waiting == 0 && s.waiting:
		s.log.Info("a runner is live again: machines dispatched")
		s.waiting = false
	}
	if !truncated {
		for m, a := range assigns {
			if _, ok := machines[m]; !ok {
				ops = append(ops, &op{machine: m, rev: a.rev, del: true})
			}
		}
	}
	conflicts := s.write(ctx, ops)
	s.report(ops, now, d.Now())

	// Forget heartbeats of runners gone and holding nothing.
	held := map[string]bool{}
	for _, it := range assigns {
		if !it.bad {
			held[it.v.GetRunner()] = true
		}
	}
	for name := range s.lastBeat {
		if _, ok := runners[name]; !ok && !held[name] {
			delete(s.lastBeat, name)
		}
	}

	wake := d.Interval
	if conflicts {
		wake = min(wake, time.Second)
	}
	for _, c := range cands {
		if c.assigned == 0 {
			continue
		}
		if until := s.lastBeat[c.name].Add(d.Expiry).Sub(now) + time.Millisecond; until > 0 && until < wake {
			wake = until
		}
	}
	return wake
}

// admitted reports whether some candidate's networks admit t.
func admitted(cands []*candidate, t target) bool {
	return slices.ContainsFunc(cands, func(c *candidate) bool { ok, _, _ := c.match(t); return ok })
}

func describeTarget(t target) string {
	switch {
	case t.bmc.IsValid() && t.boot.IsValid():
		return "bmc " + t.bmc.String() + " or boot address " + t.boot.String()
	case t.bmc.IsValid():
		return "bmc " + t.bmc.String()
	case t.boot.IsValid():
		return "boot address " + t.boot.String()
	}
	return "the machine"
}

// lenientNets parses a runner's networks, skipping malformed ones (the
// runner validates its own at start; a record from elsewhere may not be).
func lenientNets(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// write runs ops with bounded concurrency. Store errors are logged (rate
// limited) and left for the next pass; it reports whether any write met a
// conflict (another writer: the watch brings its value).
func (s *dispatch) write(ctx context.Context, ops []*op) (conflicts bool) {
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(s.d.Concurrency)
	for _, o := range ops {
		g.Go(func() error {
			key := AssignmentPrefix + o.machine
			var err error
			if o.del {
				err = s.d.Store.Delete(ctx, key, o.rev)
				if err == nil || errors.Is(err, store.ErrNotFound) {
					s.assigns.drop(o.machine, o.rev)
					o.ok, err = err == nil, nil
				}
			} else {
				var rev int64
				rev, err = record.Put(ctx, s.d.Store, key, o.a, o.rev)
				if err == nil {
					s.assigns.set(o.machine, o.a, rev)
					o.ok = true
				}
			}
			switch {
			case err == nil:
			case errors.Is(err, store.ErrConflict):
				mu.Lock()
				conflicts = true
				mu.Unlock()
				s.log.Debug("assignment changed meanwhile; looking again", "machine", o.machine)
			case ctx.Err() == nil:
				s.failures.Add(1, func(n int64) {
					s.log.Warn("assignment write failed; retrying at the next pass", "machine", o.machine, "err", err, "count", n)
				})
			}
			return nil
		})
	}
	_ = g.Wait()
	return conflicts
}

// report logs what a pass wrote: one line per runner whose machines were
// re-dispatched (with how long after its last heartbeat), one summary.
func (s *dispatch) report(ops []*op, decided, written time.Time) {
	type group struct {
		n    int
		left bool
		to   map[string]int
	}
	groups := map[string]*group{}
	assigned, deleted := 0, 0
	for _, o := range ops {
		switch {
		case !o.ok:
			continue
		case o.del:
			deleted++
			s.log.Debug("assignment of a deleted machine removed", "machine", o.machine)
			continue
		}
		assigned++
		if o.moved {
			s.log.Info("machine moved to a runner whose networks contain it", "machine", o.machine, "runner", o.a.GetRunner(), "reason", o.a.GetReason())
			continue
		}
		s.log.Debug("machine assigned", "machine", o.machine, "runner", o.a.GetRunner(), "reason", o.a.GetReason())
		if o.from == "" {
			continue
		}
		g := groups[o.from]
		if g == nil {
			g = &group{left: o.left, to: map[string]int{}}
			groups[o.from] = g
		}
		g.n++
		g.to[o.a.GetRunner()]++
	}
	for from, g := range groups {
		r := Redispatch{Runner: from, Left: g.left, Machines: g.n, LastHeartbeat: s.lastBeat[from], At: written}
		after := "unknown"
		if !r.LastHeartbeat.IsZero() {
			r.After = written.Sub(r.LastHeartbeat)
			after = r.After.Round(time.Millisecond).String()
		}
		s.d.noteRedispatch(r)
		s.log.Info("re-dispatched a runner's machines", "runner", from, "left", g.left, "machines", g.n,
			"after_heartbeat", after, "writes_took", written.Sub(decided).Round(time.Millisecond).String(), "to", fmt.Sprint(g.to))
	}
	if assigned+deleted > 0 {
		s.log.Info("dispatch pass", "assigned", assigned, "deleted", deleted)
	}
}

// bootAddrs maps the boot MACs of machines to their last full-mode DHCP
// lease address, listed at most once per Interval, and not at all while no
// machine has a boot MAC (a DHCP server's lease table can be far larger
// than the fleet's machines: listing and decoding all of it every
// Interval was a bench's largest allocation). Proxy-mode appliances hand
// out no leases: their machines have no boot address and boot segments
// do not constrain them.
func (s *dispatch) bootAddrs(ctx context.Context, now time.Time, machines map[string]item[machineInfo]) map[string]netip.Addr {
	if s.leases != nil && now.Sub(s.leasesAt) < s.d.Interval && now.After(s.leasesAt) {
		return s.leases
	}
	want := make(map[string]bool, len(machines))
	for _, it := range machines {
		if it.v.bootMAC != "" {
			want[it.v.bootMAC] = true
		}
	}
	if len(want) == 0 {
		s.leases, s.leasesAt = map[string]netip.Addr{}, now
		return s.leases
	}
	kvs, err := s.d.Store.List(ctx, LeasePrefix)
	if err != nil {
		s.failures.Add(1, func(n int64) {
			s.log.Warn("listing DHCP leases for boot segments failed", "err", err, "count", n)
		})
		return s.leases
	}
	type seen struct {
		addr    netip.Addr
		updated int64
	}
	latest := map[string]seen{}
	for _, kv := range kvs {
		var l bootv1.Lease
		if record.Unmarshal(kv.Value, &l) != nil || !want[l.GetMac()] {
			continue
		}
		a, err := netip.ParseAddr(l.GetIp())
		if err != nil {
			continue
		}
		if cur, ok := latest[l.GetMac()]; ok && cur.updated >= l.GetUpdatedUnix() {
			continue
		}
		latest[l.GetMac()] = seen{addr: a.Unmap(), updated: l.GetUpdatedUnix()}
	}
	out := make(map[string]netip.Addr, len(latest))
	for mac, v := range latest {
		out[mac] = v.addr
	}
	s.leases, s.leasesAt = out, now
	return out
}
