package pool

import (
	"context"
	"sync"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Heartbeats without a store write per beat.
//
// A hypervisor node re-applies its unchanged Node every 10 s as its
// heartbeat: 5,000 nodes are 500 compare-and-swaps of the node record a
// second, forever. With Config.HeartbeatWriteAfter set, an ApplyNode that
// would change nothing but last_heartbeat of a READY node whose stored
// heartbeat is younger than that is not written: the beat is kept in this
// process's memory (beatTable) and answered from the stored record. Every
// change of spec or state is still one compare-and-swap, so READY and
// NOT_READY, capacity and labels read the same from any appliance.
//
// Who judges readiness: the sweep (Sweeper, on the leader) takes a node's
// last heartbeat as the newest of the stored one and the one in its own
// memory, and — since beats may have been skipped before this process
// started — never older than the pool's start. So:
//   - one appliance (bbolt) sees every beat in memory: NOT_READY exactly
//     after HeartbeatTimeout of silence, whatever HeartbeatWriteAfter is;
//   - in a fleet (etcd) a beat may reach another appliance than the
//     leader; that appliance writes it once the stored one is
//     HeartbeatWriteAfter old, so appliance sets it to at most half
//     the timeout there: the stored heartbeat is then at most
//     HeartbeatWriteAfter plus one beat interval old (15 + 10 s < 30 s)
//     while a node beats, and a node silent for the timeout is
//     NOT_READY after 20-30 s of silence at the latest sweep.
//
// GetNode and ListNodes report the newest heartbeat this process knows.

// maxBeats bounds the beats kept in memory (a name and a time each, about
// 100 bytes): past it, beats of nodes not yet in the table are written as
// before.
const maxBeats = 1 << 18

// beatTable is the newest heartbeat this process received per node.
type beatTable struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// note records a beat of name at t; false when the table is full and name
// is not in it.
func (b *beatTable) note(name string, t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]time.Time{}
	}
	old, ok := b.m[name]
	if !ok && len(b.m) >= maxBeats {
		return false
	}
	if t.After(old) {
		b.m[name] = t
	}
	return true
}

func (b *beatTable) get(name string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.m[name]
	return t, ok
}

func (b *beatTable) forget(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, name)
}

// lastBeat is the newest heartbeat of n known here: the stored one or
// this process's, and, when beats may go unwritten, not before the pool
// started (beats skipped by an earlier process are not in memory).
func (p *Pool) lastBeat(n *poolv1.Node) time.Time {
	last := n.GetLastHeartbeat().AsTime()
	if t, ok := p.beats.get(n.GetName()); ok && t.After(last) {
		last = t
	}
	if p.cfg.HeartbeatWriteAfter > 0 && p.start.After(last) {
		last = p.start
	}
	return last
}

// overlay sets n's last_heartbeat to the newest this process received.
func (p *Pool) overlay(n *poolv1.Node) {
	if t, ok := p.beats.get(n.GetName()); ok && t.After(n.GetLastHeartbeat().AsTime()) {
		n.LastHeartbeat = timestamppb.New(t)
	}
}

// beatOnly answers an ApplyNode that is only a heartbeat without writing
// it (see the top of this file); ok is false when it must be written: a
// new node, a change of spec, a node not READY, a stored heartbeat
// HeartbeatWriteAfter old (or from the future), a full beat table, or a
// store error (the write path reports it).
func (p *Pool) beatOnly(ctx context.Context, req *poolv1.ApplyNodeRequest, now time.Time) (*poolv1.Node, bool) {
	after := p.cfg.HeartbeatWriteAfter
	if after <= 0 || !p.beats.note(req.GetName(), now) {
		return nil, false
	}
	cur := newNode()
	if _, err := record.Get(ctx, p.cfg.Store, nodePrefix+req.GetName(), cur); err != nil {
		return nil, false
	}
	last := cur.GetLastHeartbeat().AsTime()
	if cur.GetState() != poolv1.Node_READY || cur.GetLastHeartbeat() == nil || now.Before(last) || now.Sub(last) >= after {
		return nil, false
	}
	next := proto.CloneOf(cur)
	applySpec(next, req, cur.GetLastHeartbeat())
	if !proto.Equal(next, cur) {
		return nil, false
	}
	cur.LastHeartbeat = timestamppb.New(now)
	return cur, true
}
