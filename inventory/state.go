package inventory

import (
	"fmt"
	"slices"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// ErrInvalidTransition means the machine's state does not allow the event
// (class apierr.ErrPrecondition). Transition's errors wrap it.
var ErrInvalidTransition = apierr.New(apierr.ErrPrecondition, "invalid machine state transition")

// Event is something that happens to a machine and may change its state
// (docs/architecture.md, "The machine state machine").
type Event int

// The events, in the order of the walk.
const (
	// EventCreated: a machine record is made (DHCP placeholder, enrolment,
	// discovery report).
	EventCreated Event = iota + 1
	// EventRegistered: its discovery agent reported facts.
	EventRegistered
	// EventAccepted: an operator or auto-accept started its install.
	EventAccepted
	// EventInstallFailed: its install reported an error or timed out.
	EventInstallFailed
	// EventNodeReady: its Node became READY while it installed.
	EventNodeReady
	// EventNodeReadyAfterWatchdog: its Node became READY after the boot
	// watchdog had failed it with its install done (the reboot into the
	// hypervisor outlasted the watchdog).
	EventNodeReadyAfterWatchdog
	// EventWatchdogExpired: the boot watchdog gave up on it.
	EventWatchdogExpired
	// EventReprovisioned: an operator sent it back to discovery.
	EventReprovisioned
	// EventWipeFailed: the disk wipe of a reprovision failed.
	EventWipeFailed
	// EventMaintenanceOn and EventMaintenanceOff: an operator put it in
	// MAINTENANCE or took it out.
	EventMaintenanceOn
	EventMaintenanceOff
	// EventParked: a discovery report claimed an identity it could not
	// prove and was parked as a record of its own (claims.go).
	EventParked
	// EventAdopted: an operator adopted a parked report as a machine of
	// its own.
	EventAdopted
	// EventPooled: an operator accepted it for people (accept --target
	// pool): READY, free to allocate.
	EventPooled
	// EventAllocated: an allocation claimed it for an owner.
	EventAllocated
	// EventReleased: its owner or an operator released it, or its
	// allocation expired; it is free again. (When release erases the
	// disks, a RELEASING state goes between.)
	EventReleased
	// EventDeploying: its owner or an operator started an OS deploy
	// (DeployMachine), or a deploy again after one failed or finished.
	EventDeploying
	// EventDeployFailed: a deploy step failed or timed out.
	EventDeployFailed
	// EventDeployBooted: the deployed OS booted and phoned home.
	EventDeployBooted
	// EventReleasing: released with an erase level: its disks are erased
	// before it is free again.
	EventReleasing
	// EventErased: the release's erase succeeded on every disk.
	EventErased
	// EventEraseFailed: the release's erase failed or timed out.
	EventEraseFailed
)

// lastEvent is the highest Event; the table test walks up to it.
const lastEvent = EventEraseFailed

var eventNames = [...]string{
	EventCreated: "created", EventRegistered: "registered", EventAccepted: "accepted",
	EventInstallFailed: "install-failed", EventNodeReady: "node-ready",
	EventNodeReadyAfterWatchdog: "node-ready-after-watchdog", EventWatchdogExpired: "watchdog-expired",
	EventReprovisioned: "reprovisioned", EventWipeFailed: "wipe-failed",
	EventMaintenanceOn: "maintenance-on", EventMaintenanceOff: "maintenance-off",
	EventParked: "parked", EventAdopted: "adopted",
	EventPooled: "pooled", EventAllocated: "allocated", EventReleased: "released",
	EventDeploying: "deploying", EventDeployFailed: "deploy-failed", EventDeployBooted: "deploy-booted",
	EventReleasing: "releasing", EventErased: "erased", EventEraseFailed: "erase-failed",
}

func (e Event) String() string {
	if e > 0 && int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// transitionError is an ErrInvalidTransition whose text is the operator's
// message alone.
type transitionError struct{ msg string }

func (e *transitionError) Error() string { return e.msg }
func (e *transitionError) Unwrap() error { return ErrInvalidTransition }

func refuse(format string, a ...any) error {
	return &transitionError{msg: fmt.Sprintf(format, a...)}
}

// Transition is the machine state machine: every change of a machine's
// State goes through it. It moves m from its current state to the one ev
// leads to, or returns an error wrapping ErrInvalidTransition and leaves
// m unchanged. It reads nothing but m.State, except for the owner's
// events (deploying, released, releasing), which need an open allocation
// (m.Allocation set, not released), and EventMaintenanceOff, which
// restores what EventMaintenanceOn remembered
// (MaintenancePreviousState and MaintenancePreviousReason, which it
// writes; without a remembered state a machine with facts is INVENTORIED,
// one without DISCOVERED). Every other field (state reason, boot intent,
// install, watchdog) is its caller's, set in the same mutation.
//
// The table (TestTransitionTable enumerates every state and event):
//
//	created                   UNSPECIFIED → DISCOVERED; any other state is kept
//	registered                UNSPECIFIED, DISCOVERED → INVENTORIED; CONFLICT refused; any other state is kept
//	accepted                  INVENTORIED, FAILED (not allocated), READY → INSTALLING
//	install-failed            INSTALLING → FAILED
//	node-ready                INSTALLING → DEPLOYED
//	node-ready-after-watchdog FAILED → DEPLOYED
//	watchdog-expired          any but MAINTENANCE, CONFLICT → FAILED
//	reprovisioned             any but MAINTENANCE, CONFLICT, ALLOCATED, DEPLOYING, RELEASING, allocated → DISCOVERED
//	wipe-failed               any but MAINTENANCE, CONFLICT → FAILED
//	maintenance-on            any but CONFLICT → MAINTENANCE
//	maintenance-off           MAINTENANCE → the remembered state
//	parked                    UNSPECIFIED, CONFLICT → CONFLICT
//	adopted                   CONFLICT → INVENTORIED
//	pooled                    INVENTORIED, FAILED (not allocated, no failed erase), READY → READY
//	allocated                 READY → ALLOCATED
//	released                  ALLOCATED; DEPLOYING, DEPLOYED, FAILED (allocated) → READY
//	deploying                 ALLOCATED; DEPLOYED, FAILED (allocated) → DEPLOYING
//	deploy-failed             DEPLOYING → FAILED
//	deploy-booted             DEPLOYING → DEPLOYED
//	releasing                 ALLOCATED; DEPLOYING, DEPLOYED, FAILED (allocated); FAILED, RELEASING with an erase (again) → RELEASING
//	erased                    RELEASING → READY
//	erase-failed              RELEASING → FAILED
//
// Transition does no I/O and changes nothing but m, so it is safe inside
// a compare-and-swap mutation that may run more than once.
func Transition(m *inventoryv1.Machine, ev Event) error {
	name, from := m.GetName(), m.GetState()
	to := from
	switch ev {
	case EventCreated:
		if from == inventoryv1.Machine_UNSPECIFIED {
			to = inventoryv1.Machine_DISCOVERED
		}
	case EventRegistered:
		switch from {
		case inventoryv1.Machine_UNSPECIFIED, inventoryv1.Machine_DISCOVERED:
			to = inventoryv1.Machine_INVENTORIED
		case inventoryv1.Machine_CONFLICT:
			return refuse("machine %q is a parked report in CONFLICT: adopt or reject it", name)
		default:
			// Already past discovery: a re-register leaves the state.
		}
	case EventAccepted:
		if from == inventoryv1.Machine_FAILED && allocHeld(m) {
			return refuse("machine %q is FAILED and allocated: release it first (corral machine release %s)", name, name)
		}
		switch from {
		case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_FAILED, inventoryv1.Machine_READY:
			to = inventoryv1.Machine_INSTALLING
		case inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYING:
			return refuse("machine %q is %s: release it first (corral machine release %s)", name, from, name)
		case inventoryv1.Machine_RELEASING:
			return refuse("machine %q is RELEASING: its disks are being erased", name)
		case inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
			if allocHeld(m) {
				return refuse("machine %q is %s for its owner: release it first (corral machine release %s)", name, from, name)
			}
			return refuse("machine %q is %s: already deployed: reprovision it first", name, from)
		case inventoryv1.Machine_MAINTENANCE:
			return refuse("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
		case inventoryv1.Machine_CONFLICT:
			return refuse("machine %q is a parked report in CONFLICT: adopt it (corral machine adopt %s) or reject it first", name, name)
		default:
			return refuse("machine %q is %s: it has reported no facts yet; network-boot it into discovery first", name, from)
		}
	case EventInstallFailed, EventNodeReady:
		if from != inventoryv1.Machine_INSTALLING {
			return refuse("machine %q is %s, not INSTALLING: %s does not apply", name, from, ev)
		}
		to = inventoryv1.Machine_FAILED
		if ev == EventNodeReady {
			to = inventoryv1.Machine_DEPLOYED
		}
	case EventNodeReadyAfterWatchdog:
		if from != inventoryv1.Machine_FAILED {
			return refuse("machine %q is %s, not FAILED: %s does not apply", name, from, ev)
		}
		to = inventoryv1.Machine_DEPLOYED
	case EventWatchdogExpired, EventWipeFailed, EventReprovisioned:
		if from == inventoryv1.Machine_MAINTENANCE {
			return refuse("machine %q is in MAINTENANCE", name)
		}
		if from == inventoryv1.Machine_CONFLICT {
			return refuse("machine %q is a parked report in CONFLICT: adopt or reject it", name)
		}
		if ev == EventReprovisioned && (from == inventoryv1.Machine_ALLOCATED || from == inventoryv1.Machine_DEPLOYING || allocHeld(m)) {
			return refuse("machine %q is %s: release it first (corral machine release %s)", name, from, name)
		}
		if ev == EventReprovisioned && from == inventoryv1.Machine_RELEASING {
			return refuse("machine %q is RELEASING: its disks are being erased", name)
		}
		to = inventoryv1.Machine_FAILED
		if ev == EventReprovisioned {
			to = inventoryv1.Machine_DISCOVERED
		}
	case EventMaintenanceOn:
		if from == inventoryv1.Machine_CONFLICT {
			return refuse("machine %q is a parked report in CONFLICT: adopt or reject it", name)
		}
		if from != inventoryv1.Machine_MAINTENANCE {
			m.MaintenancePreviousState = from
			m.MaintenancePreviousReason = m.GetStateReason()
		}
		to = inventoryv1.Machine_MAINTENANCE
	case EventMaintenanceOff:
		if from != inventoryv1.Machine_MAINTENANCE {
			return refuse("machine %q is %s, not in MAINTENANCE", name, from)
		}
		to = m.GetMaintenancePreviousState()
		if to == inventoryv1.Machine_UNSPECIFIED || to == inventoryv1.Machine_MAINTENANCE {
			to = inventoryv1.Machine_DISCOVERED
			if m.GetFacts() != nil {
				to = inventoryv1.Machine_INVENTORIED
			}
		}
		m.StateReason = m.GetMaintenancePreviousReason()
		m.MaintenancePreviousState = inventoryv1.Machine_UNSPECIFIED
		m.MaintenancePreviousReason = ""
	case EventParked:
		if from != inventoryv1.Machine_UNSPECIFIED && from != inventoryv1.Machine_CONFLICT {
			return refuse("machine %q is %s: only a new record is parked", name, from)
		}
		to = inventoryv1.Machine_CONFLICT
	case EventAdopted:
		if from != inventoryv1.Machine_CONFLICT {
			return refuse("machine %q is %s, not a parked report in CONFLICT", name, from)
		}
		to = inventoryv1.Machine_INVENTORIED
	case EventPooled:
		if from == inventoryv1.Machine_FAILED && allocHeld(m) {
			return refuse("machine %q is FAILED and allocated: release it first (corral machine release %s)", name, name)
		}
		if from == inventoryv1.Machine_FAILED && m.GetErase().GetError() != "" {
			return refuse("machine %q failed its erase: erase it again (corral machine release %s --erase ...) first", name, name)
		}
		switch from {
		case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_FAILED, inventoryv1.Machine_READY:
			to = inventoryv1.Machine_READY
		case inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYING, inventoryv1.Machine_RELEASING:
			return refuse("machine %q is %s: it is in its pool already", name, from)
		case inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
			return refuse("machine %q is %s: a hypervisor node: reprovision it first", name, from)
		case inventoryv1.Machine_MAINTENANCE:
			return refuse("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
		case inventoryv1.Machine_CONFLICT:
			return refuse("machine %q is a parked report in CONFLICT: adopt it (corral machine adopt %s) or reject it first", name, name)
		default:
			return refuse("machine %q is %s: it has reported no facts yet; network-boot it into discovery first", name, from)
		}
	case EventAllocated:
		if from != inventoryv1.Machine_READY {
			return refuse("machine %q is %s, not READY: it cannot be allocated", name, from)
		}
		to = inventoryv1.Machine_ALLOCATED
	case EventReleased, EventReleasing:
		retry := ev == EventReleasing && !allocHeld(m)
		switch {
		case ev == EventReleasing && retry && m.GetErase() != nil &&
			(from == inventoryv1.Machine_RELEASING || from == inventoryv1.Machine_FAILED):
			// An erase that failed (or one an operator runs again).
		case from == inventoryv1.Machine_ALLOCATED:
		case allocatedTo(m, from, inventoryv1.Machine_DEPLOYING, inventoryv1.Machine_DEPLOYED, inventoryv1.Machine_FAILED):
		case from == inventoryv1.Machine_RELEASING:
			return refuse("machine %q is RELEASING: its disks are being erased", name)
		default:
			return refuse("machine %q is %s, not allocated: nothing to release", name, from)
		}
		to = inventoryv1.Machine_READY
		if ev == EventReleasing {
			to = inventoryv1.Machine_RELEASING
		}
	case EventDeploying:
		switch {
		case from == inventoryv1.Machine_ALLOCATED:
		case allocatedTo(m, from, inventoryv1.Machine_DEPLOYED, inventoryv1.Machine_FAILED):
		case from == inventoryv1.Machine_DEPLOYING:
			return refuse("machine %q is DEPLOYING already: wait for it, or release it", name)
		case from == inventoryv1.Machine_READY:
			return refuse("machine %q is READY, not allocated: allocate it first (corral machine allocate)", name)
		default:
			return refuse("machine %q is %s and not allocated: only an allocated machine is deployed", name, from)
		}
		to = inventoryv1.Machine_DEPLOYING
	case EventDeployFailed, EventDeployBooted:
		if from != inventoryv1.Machine_DEPLOYING {
			return refuse("machine %q is %s, not DEPLOYING: %s does not apply", name, from, ev)
		}
		to = inventoryv1.Machine_FAILED
		if ev == EventDeployBooted {
			to = inventoryv1.Machine_DEPLOYED
		}
	case EventErased, EventEraseFailed:
		if from != inventoryv1.Machine_RELEASING {
			return refuse("machine %q is %s, not RELEASING: %s does not apply", name, from, ev)
		}
		to = inventoryv1.Machine_FAILED
		if ev == EventErased {
			to = inventoryv1.Machine_READY
		}
	default:
		return refuse("machine %q: unknown event %s", name, ev)
	}
	m.State = to
	return nil
}

// allocatedTo reports whether m has an open allocation and its state
// (from) is one of states: a deployed, deploying or failed machine of an
// owner, as opposed to a hypervisor node in the same state.
func allocatedTo(m *inventoryv1.Machine, from inventoryv1.Machine_MachineState, states ...inventoryv1.Machine_MachineState) bool {
	return allocHeld(m) && slices.Contains(states, from)
}
