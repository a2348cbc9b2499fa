package lifecycle

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// autoAccepted is what the auto-accept policy did inside a Register
// mutation.
type autoAccepted struct {
	id, path string
	err      error // the policy matched but the machine cannot be accepted
}

// autoAccept runs inside Register's mutation: a machine that just became
// INVENTORIED and matches every selector starts installing on disk auto
// (no wipe).
func (l *Lifecycle) autoAccept(m *inventoryv1.Machine, became bool) autoAccepted {
	if !l.cfg.AutoAccept || !became || m.GetState() != inventoryv1.Machine_INVENTORIED || !l.sels.Match(m) {
		return autoAccepted{}
	}
	id := newID()
	path, err := startInstall(m, id, "auto", false, timestamppb.New(l.now()))
	if err != nil {
		return autoAccepted{err: err}
	}
	return autoAccepted{id: id, path: path}
}

// afterAutoAccept records what autoAccept did once the mutation is
// committed. The registering agent opens its session next: the plan goes
// then (now, when an older session of the machine is still open).
func (l *Lifecycle) afterAutoAccept(ctx context.Context, m *inventoryv1.Machine, acc autoAccepted) *inventoryv1.Machine {
	switch {
	case acc.err != nil:
		l.event(m, "lifecycle", "auto-accept-failed", acc.err.Error(), nil)
		l.log.Warn("auto-accept failed", "machine", m.GetName(), "err", acc.err)
	case acc.id != "":
		l.accepted(m, acc.id, acc.path, false)
		if l.sess.connected(m.GetName()) {
			if m.GetWipe().GetDisk() == "" {
				if sm := l.sendPlan(ctx, m); sm != nil {
					m = sm
				}
			}
		} else {
			l.event(m, "lifecycle", "waiting", "install plan waits for the discovery agent: network-boot the machine", nil)
		}
		l.event(m, "lifecycle", "auto-accepted", "auto-accept policy matched", nil)
	}
	return m
}
