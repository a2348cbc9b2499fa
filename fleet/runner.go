package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ErrNameInUse means another live appliance runs under this appliance's name
// (class apierr.ErrAlreadyExists).
var ErrNameInUse = apierr.New(apierr.ErrAlreadyExists, "appliance name in use by another appliance")

// Runner is one appliance's presence in the fleet: it writes its record
// under AppliancePrefix at start and every Interval (its heartbeat), and
// deletes it when it stops, so that the leader re-dispatches its machines
// at once instead of after the expiry.
//
// The record is this appliance's alone: a start that finds a live record of
// the same name written by another process waits until that record either
// expires (a crashed predecessor: taken over) or heartbeats again (another
// appliance: refused with ErrNameInUse). Processes are told apart by the
// record's started_at, which each process sets once (the record has no
// incarnation field).
type Runner struct {
	Store store.Store
	// Self is this appliance's spec: name, API endpoint, boot segments,
	// BMC networks, version. The runner does not modify it.
	Self *fleetv1.Appliance
	// Interval between heartbeats (default DefaultInterval).
	Interval time.Duration
	// Expiry is how long a record stays live after its heartbeat (default
	// DefaultExpiry); a start waits at most this long for a live record of
	// its name to expire.
	Expiry time.Duration
	// Load counts the machines this runner holds (nil: 0).
	Load   func() int
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time

	// crash, set by tests, skips the graceful delete: the record stays and
	// expires, as when the process is killed.
	crash bool
}

func (r *Runner) fill() error {
	if r.Store == nil {
		return errors.New("fleet: Runner.Store is required")
	}
	if err := CheckAppliance(r.Self); err != nil {
		return err
	}
	if r.Interval <= 0 {
		r.Interval = DefaultInterval
	}
	if r.Expiry <= 0 {
		r.Expiry = DefaultExpiry
	}
	if r.Expiry <= r.Interval {
		return apierr.Invalidf("runner expiry %s must be longer than the heartbeat interval %s", r.Expiry, r.Interval)
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	return nil
}

// Run registers the runner, heartbeats every Interval until ctx ends, then
// deletes its record and returns nil. It returns an error wrapping
// ErrNameInUse when another live appliance holds the name (at start, or
// later if another process took the record over), and an error when the
// configuration is invalid. Store errors during heartbeats are logged and
// retried at the next beat: the record expires if they last.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.fill(); err != nil {
		return err
	}
	log := r.Logger.With("appliance", r.Self.GetName())
	key := AppliancePrefix + r.Self.GetName()
	rec := proto.CloneOf(r.Self)
	rec.Role, rec.Assigned = fleetv1.Appliance_ROLE_UNSPECIFIED, 0
	rec.StartedAt = timestamppb.New(r.Now())
	rev, err := r.claim(ctx, key, rec, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	log.Info("runner registered", "interval", r.Interval.String(), "expiry", r.Expiry.String())
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.leave(key, rec, rev, log)
			return nil
		case <-t.C:
		}
		next, err := r.beat(ctx, key, rec, rev)
		switch {
		case errors.Is(err, ErrNameInUse):
			return err
		case err != nil && ctx.Err() == nil:
			log.Warn("runner heartbeat failed; retrying at the next beat", "err", err)
		case err == nil:
			rev = next
		}
	}
}

func (r *Runner) stamp(rec *fleetv1.Appliance) {
	rec.LastHeartbeat = timestamppb.New(r.Now())
	if r.Load != nil {
		rec.Load = uint32(max(r.Load(), 0))
	}
}

func sameProcess(a, b *fleetv1.Appliance) bool {
	return proto.Equal(a.GetStartedAt(), b.GetStartedAt())
}

// claim writes the first record. A live record of another process is
// watched until it expires (taken over) or changes (refused).
func (r *Runner) claim(ctx context.Context, key string, rec *fleetv1.Appliance, log *slog.Logger) (int64, error) {
	var waited *fleetv1.Appliance
	var waitedRev int64
	for {
		cur := &fleetv1.Appliance{}
		curRev, err := record.Get(ctx, r.Store, key, cur)
		exists := true
		switch {
		case errors.Is(err, store.ErrNotFound):
			exists = false
		case errors.Is(err, store.ErrCorrupt):
			// An undecodable record is no one's: overwrite it.
			kv, gerr := r.Store.Get(ctx, key)
			if gerr != nil {
				return 0, gerr
			}
			log.Warn("replacing an undecodable runner record", "err", err)
			cur, curRev = &fleetv1.Appliance{}, kv.Revision
		case err != nil:
			return 0, fmt.Errorf("runner %s: read its record: %w", r.Self.GetName(), err)
		}
		now := r.Now()
		if exists && Live(cur, now, r.Expiry) && !sameProcess(cur, rec) {
			if waited != nil && curRev != waitedRev {
				return 0, fmt.Errorf("%w: %s heartbeats under the name %q (endpoint %s, started %s): give each appliance its own --appliance-name",
					ErrNameInUse, describe(cur), r.Self.GetName(), cellOr(cur.GetApiEndpoint()), cur.GetStartedAt().AsTime().UTC().Format(time.RFC3339))
			}
			if waited == nil {
				waited, waitedRev = cur, curRev
				log.Info("a live record already has this appliance's name: waiting until it expires (a crashed predecessor) or heartbeats again (another appliance: refused)",
					"heartbeat_age", now.Sub(cur.GetLastHeartbeat().AsTime()).Round(time.Millisecond).String(), "endpoint", cur.GetApiEndpoint())
			}
			wait := min(time.Second, time.Until(cur.GetLastHeartbeat().AsTime().Add(r.Expiry))+10*time.Millisecond)
			t := time.NewTimer(max(wait, 10*time.Millisecond))
			select {
			case <-ctx.Done():
				t.Stop()
				return 0, ctx.Err()
			case <-t.C:
			}
			continue
		}
		if exists && waited != nil {
			log.Info("taking over the expired record of a previous process of this appliance", "started_at", cur.GetStartedAt().AsTime().UTC().Format(time.RFC3339))
		}
		r.stamp(rec)
		rev, err := record.Put(ctx, r.Store, key, rec, curRev)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("runner %s: write its record: %w", r.Self.GetName(), err)
		}
		return rev, nil
	}
}

func describe(a *fleetv1.Appliance) string {
	if v := a.GetVersion(); v != "" {
		return "another appliance (version " + v + ")"
	}
	return "another appliance"
}

func cellOr(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// beat writes one heartbeat by compare-and-swap. A conflict re-reads the
// record: this process's own record (a write that timed out but committed)
// is beaten again at its revision; another process's is ErrNameInUse; a
// deleted record is written again.
func (r *Runner) beat(ctx context.Context, key string, rec *fleetv1.Appliance, rev int64) (int64, error) {
	for range 8 {
		r.stamp(rec)
		next, err := record.Put(ctx, r.Store, key, rec, rev)
		if !errors.Is(err, store.ErrConflict) {
			return next, err
		}
		cur := &fleetv1.Appliance{}
		curRev, err := record.Get(ctx, r.Store, key, cur)
		switch {
		case errors.Is(err, store.ErrNotFound):
			rev = 0
		case err != nil:
			return 0, err
		case !sameProcess(cur, rec):
			return 0, fmt.Errorf("%w: %s took over the record of %q (started %s): give each appliance its own --appliance-name",
				ErrNameInUse, describe(cur), r.Self.GetName(), cur.GetStartedAt().AsTime().UTC().Format(time.RFC3339))
		default:
			rev = curRev
		}
	}
	return 0, apierr.Conflictf("runner %s: heartbeat kept conflicting", r.Self.GetName())
}

// leave deletes this process's record, so its machines are re-dispatched
// at once. It has its own deadline: ctx has already ended.
func (r *Runner) leave(key string, rec *fleetv1.Appliance, rev int64, log *slog.Logger) {
	if r.crash {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 4 {
		err := r.Store.Delete(ctx, key, rev)
		if err == nil || errors.Is(err, store.ErrNotFound) {
			log.Info("runner left the fleet")
			return
		}
		if !errors.Is(err, store.ErrConflict) {
			log.Warn("runner record not deleted; it expires instead", "err", err)
			return
		}
		cur := &fleetv1.Appliance{}
		curRev, gerr := record.Get(ctx, r.Store, key, cur)
		if gerr != nil || !sameProcess(cur, rec) {
			return // gone, or another process's now
		}
		rev = curRev
	}
}
