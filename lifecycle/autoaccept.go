package lifecycle

import (
	"context"
	"slices"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Auto-accept trusts the boot LAN by definition: a machine that
// network-boots and registers is installed with no operator looking at it,
// and becomes a hypervisor node that virtual machines — with their disks,
// their networks and the secrets in their cloud-init — can be scheduled
// onto. Anyone who can plug a machine into the provisioning network (or
// spoof one's discovery report) can therefore make a node of it. The guard:
//   - selectors (AutoAcceptSelectors) the machine's facts must all match;
//   - an allowlist of serials (AutoAcceptSerials): when set, only a machine
//     whose real serial is on it is accepted — the operator names the
//     hardware they bought;
//   - a machine flagged by inventory (duplicate-serial, mac-conflict: two
//     reports claiming one identity) is never auto-accepted; an operator
//     looks at it and accepts it by hand.
// A serial is not a secret (it is printed on the chassis and readable by
// anything that boots on the machine), so the allowlist narrows the blast
// radius to hardware the operator owns rather than proving anything; on a
// boot LAN that is not physically controlled, leave auto-accept off.

// autoAccepted is what the auto-accept policy did inside a Register
// mutation.
type autoAccepted struct {
	id, path string
	err      error  // the policy matched but the machine cannot be accepted
	skipped  string // the selectors matched but the guard refused: why
}

// autoAccept runs inside Register's mutation: a machine that just became
// INVENTORIED, matches every selector and passes the guard (serial
// allowlist, no flags) starts installing on disk auto (no wipe).
func (l *Lifecycle) autoAccept(m *inventoryv1.Machine, became bool) autoAccepted {
	if !l.cfg.AutoAccept || !became || m.GetState() != inventoryv1.Machine_INVENTORIED || !l.sels.Match(m) {
		return autoAccepted{}
	}
	if why := l.autoAcceptGuard(m); why != "" {
		return autoAccepted{skipped: why}
	}
	id := newID()
	path, err := startInstall(m, id, "auto", false, timestamppb.New(l.now()))
	if err != nil {
		return autoAccepted{err: err}
	}
	return autoAccepted{id: id, path: path}
}

// autoAcceptGuard says why m, which matches the selectors, must still not
// be auto-accepted, or "".
func (l *Lifecycle) autoAcceptGuard(m *inventoryv1.Machine) string {
	for _, f := range m.GetFlags() {
		if strings.HasPrefix(f, inventory.FlagDuplicateSerial) || strings.HasPrefix(f, inventory.FlagMACConflict) {
			return "the machine is flagged (" + f + "): accept it by hand once checked"
		}
	}
	if len(l.cfg.AutoAcceptSerials) > 0 {
		switch s := m.GetSerial(); {
		case s == "":
			return "the machine reports no real serial and auto-accept is limited to the --auto-accept-serials allowlist"
		case !slices.Contains(l.cfg.AutoAcceptSerials, s):
			return "serial " + s + " is not on the --auto-accept-serials allowlist"
		}
	}
	return ""
}

// afterAutoAccept records what autoAccept did once the mutation is
// committed. The registering agent opens its session next: the plan goes
// then (now, when an older session of the machine is still open).
func (l *Lifecycle) afterAutoAccept(ctx context.Context, m *inventoryv1.Machine, acc autoAccepted) *inventoryv1.Machine {
	switch {
	case acc.skipped != "":
		l.event(m, "lifecycle", "auto-accept-skipped", acc.skipped, nil)
		l.log.Info("auto-accept skipped", "machine", m.GetName(), "serial", m.GetSerial(), "reason", acc.skipped)
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
