package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"
)

// Session claims keep the one-live-session-per-machine rule (sessions.go)
// across the appliances of a fleet. A stream's session registry is per
// process; in a fleet the agent may dial any appliance, so whoever holds a
// stream also holds a claim naming its appliance and stream, refreshed at
// half the heartbeat timeout while heartbeats arrive. Another appliance
// refuses a second stream while the claim is fresh, exactly as one appliance
// refuses a second local stream; a stale claim (its appliance died, its
// agent went silent) is taken over. The stream that ends deletes its own
// claim. An appliance alone on its store leaves Config.Claims nil: its
// registry already sees every stream.

// SessionClaims records which appliance holds a machine's agent session
// (fleet.SessionClaims keeps them in the shared store).
type SessionClaims interface {
	// Claim records this appliance's stream as machine's session; it
	// returns an apierr.ErrPrecondition error when another appliance's
	// claim was refreshed within fresh.
	Claim(ctx context.Context, machine, stream, peer string, now time.Time, fresh time.Duration) error
	// Beat refreshes stream's claim; false: it is no longer stream's.
	Beat(ctx context.Context, machine, stream string, now time.Time) (bool, error)
	// Release deletes stream's claim if it is still stream's.
	Release(ctx context.Context, machine, stream string) error
}

// claim is this appliance's claim on a machine's session.
type claim struct {
	machine string
	stream  string
	beat    time.Time // last written
}

func newStreamID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// claimSession claims machine's session for a new stream (nil claim when
// claims are off).
func (l *Lifecycle) claimSession(ctx context.Context, machine, peer string) (*claim, error) {
	if l.cfg.Claims == nil {
		return nil, nil
	}
	c := &claim{machine: machine, stream: newStreamID(), beat: l.now()}
	if err := l.cfg.Claims.Claim(ctx, machine, c.stream, peer, c.beat, l.sess.lim.HeartbeatTimeout); err != nil {
		return nil, err
	}
	return c, nil
}

// beatClaim refreshes c at most every half heartbeat timeout. It reports
// false when the claim is no longer this stream's (taken over after it
// went stale): the stream must end.
func (l *Lifecycle) beatClaim(ctx context.Context, c *claim) bool {
	if c == nil {
		return true
	}
	now := l.now()
	if now.Sub(c.beat) < l.sess.lim.HeartbeatTimeout/2 {
		return true
	}
	mine, err := l.cfg.Claims.Beat(ctx, c.machine, c.stream, now)
	switch {
	case err != nil:
		// The store did not answer: keep the stream; the claim goes
		// stale only after the heartbeat timeout.
		l.log.Warn("session claim not refreshed", "machine", c.machine, "err", err)
		return true
	case !mine:
		return false
	}
	c.beat = now
	return true
}

// releaseClaim deletes c if it is still this stream's.
func (l *Lifecycle) releaseClaim(c *claim) {
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.cfg.Claims.Release(ctx, c.machine, c.stream); err != nil {
		l.log.Warn("session claim not released; it goes stale after the heartbeat timeout", "machine", c.machine, "err", err)
	}
}
