package fleet

import (
	"context"
	"errors"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ClaimPrefix holds one fleetv1.SessionClaim per machine: which appliance
// holds the machine's agent session (lifecycle's one-live-session rule,
// across appliances).
const ClaimPrefix = store.SessionsPrefix

// SessionClaims keeps the claims in the shared store for the appliance
// Self; it implements lifecycle.SessionClaims.
type SessionClaims struct {
	Store store.Store
	Self  string
}

var errNotMine = errors.New("claim is not this stream's")

func newClaim() *fleetv1.SessionClaim { return &fleetv1.SessionClaim{} }

// Claim records that Self holds machine's session as stream, unless another
// appliance's claim was refreshed within fresh: then it returns an
// ErrPrecondition error naming that appliance. A stale claim is taken over.
func (c *SessionClaims) Claim(ctx context.Context, machine, stream, peer string, now time.Time, fresh time.Duration) error {
	var refused error
	_, err := record.Update(ctx, c.Store, ClaimPrefix+machine, newClaim, func(sc *fleetv1.SessionClaim, exists bool) (bool, error) {
		if exists && sc.GetAppliance() != c.Self {
			if age := now.Sub(sc.GetBeatAt().AsTime()); age <= fresh {
				refused = apierr.Preconditionf("machine %s already has a live agent session on appliance %s (last heartbeat %s ago): a second session is refused while it is alive (within %s of its last heartbeat)",
					machine, sc.GetAppliance(), age.Round(time.Second), fresh)
				return false, refused
			}
		}
		sc.Machine, sc.Appliance, sc.Stream, sc.Peer = machine, c.Self, stream, peer
		sc.StartedAt, sc.BeatAt = timestamppb.New(now), timestamppb.New(now)
		return false, nil
	})
	if refused != nil {
		return refused
	}
	return err
}

// Beat refreshes stream's claim on machine. It reports false when the claim
// is no longer stream's (taken over, or gone).
func (c *SessionClaims) Beat(ctx context.Context, machine, stream string, now time.Time) (bool, error) {
	_, err := record.Update(ctx, c.Store, ClaimPrefix+machine, newClaim, func(sc *fleetv1.SessionClaim, exists bool) (bool, error) {
		if !exists || sc.GetStream() != stream {
			return false, errNotMine
		}
		sc.BeatAt = timestamppb.New(now)
		return false, nil
	})
	if errors.Is(err, errNotMine) {
		return false, nil
	}
	return err == nil, err
}

// Release deletes stream's claim on machine, if it is still stream's.
func (c *SessionClaims) Release(ctx context.Context, machine, stream string) error {
	_, err := record.Update(ctx, c.Store, ClaimPrefix+machine, newClaim, func(sc *fleetv1.SessionClaim, exists bool) (bool, error) {
		if !exists || sc.GetStream() != stream {
			return false, errNotMine
		}
		return true, nil
	})
	if errors.Is(err, errNotMine) {
		return nil
	}
	return err
}
