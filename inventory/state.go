package inventory

import (
	"fmt"

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
)

// lastEvent is the highest Event; the table test walks up to it.
const lastEvent = EventReleased

var eventNames = [...]string{
	EventCreated: "created", EventRegistered: "registered", EventAccepted: "accepted",
	EventInstallFailed: "install-failed", EventNodeReady: "node-ready",
	EventNodeReadyAfterWatchdog: "node-ready-after-watchdog", EventWatchdogExpired: "watchdog-expired",
	EventReprovisioned: "reprovisioned", EventWipeFailed: "wipe-failed",
	EventMaintenanceOn: "maintenance-on", EventMaintenanceOff: "maintenance-off",
	EventParked: "parked", EventAdopted: "adopted",
	EventPooled: "pooled", EventAllocated: "allocated", EventReleased: "released",
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
// m unchanged. It reads nothing but m.State, except for
// EventMaintenanceOff, which restores what EventMaintenanceOn remembered
// (MaintenancePreviousState and MaintenancePreviousReason, which it
// writes; without a remembered state a machine with facts is INVENTORIED,
// one without DISCOVERED). Every other field (state reason, boot intent,
// install, watchdog) is its caller's, set in the same mutation.
//
// The table (TestTransitionTable enumerates every state and event):
//
//	created                   UNSPECIFIED → DISCOVERED; any other state is kept
//	registered                UNSPECIFIED, DISCOVERED → INVENTORIED; CONFLICT refused; any other state is kept
//	accepted                  INVENTORIED, FAILED, READY → INSTALLING
//	install-failed            INSTALLING → FAILED
//	node-ready                INSTALLING → DEPLOYED
//	node-ready-after-watchdog FAILED → DEPLOYED
//	watchdog-expired          any but MAINTENANCE, CONFLICT → FAILED
//	reprovisioned             any but MAINTENANCE, CONFLICT, ALLOCATED → DISCOVERED
//	wipe-failed               any but MAINTENANCE, CONFLICT → FAILED
//	maintenance-on            any but CONFLICT → MAINTENANCE
//	maintenance-off           MAINTENANCE → the remembered state
//	parked                    UNSPECIFIED, CONFLICT → CONFLICT
//	adopted                   CONFLICT → INVENTORIED
//	pooled                    INVENTORIED, FAILED, READY → READY
//	allocated                 READY → ALLOCATED
//	released                  ALLOCATED → READY
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
		switch from {
		case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_FAILED, inventoryv1.Machine_READY:
			to = inventoryv1.Machine_INSTALLING
		case inventoryv1.Machine_ALLOCATED:
			return refuse("machine %q is ALLOCATED: release it first (corral machine release %s)", name, name)
		case inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
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
		if ev == EventReprovisioned && from == inventoryv1.Machine_ALLOCATED {
			return refuse("machine %q is ALLOCATED: release it first (corral machine release %s)", name, name)
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
		switch from {
		case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_FAILED, inventoryv1.Machine_READY:
			to = inventoryv1.Machine_READY
		case inventoryv1.Machine_ALLOCATED:
			return refuse("machine %q is ALLOCATED: it is in its pool already", name)
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
	case EventReleased:
		if from != inventoryv1.Machine_ALLOCATED {
			return refuse("machine %q is %s, not ALLOCATED: nothing to release", name, from)
		}
		to = inventoryv1.Machine_READY
	default:
		return refuse("machine %q: unknown event %s", name, ev)
	}
	m.State = to
	return nil
}
