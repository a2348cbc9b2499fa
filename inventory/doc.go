// Package inventory owns physical machines: identity (serial first, then
// system UUID, then MAC), facts and their dated history, the MAC, serial,
// UUID and BMC-address indexes, boot intent, the in-band BMC address a
// discovery report carries, the machine state machine (Transition: every
// change of a machine's state goes through it), and the per-MAC boot
// timeline that answers "why didn't it boot?".
//
// MachineServer (grpc.go, watch.go) is the one implementation of
// corral.inventory.v1 MachineService: it serves list, get, delete, watch
// and timeline itself and hands enrolment and power to BMCVerbs (BMC
// control, package inventory/bmc) and the lifecycle verbs to
// LifecycleVerbs (package lifecycle), interfaces it declares; cmd wires
// them. Register takes a hook that runs inside its one machine mutation,
// so a discovery report and what the lifecycle decides about it are
// written together. OnDelete lets services that keep records beside a
// machine (BMC control's sealed password) remove them.
//
// Every machine change is a compare-and-swap on the record's store revision
// (store/record.Update). Index records cannot share it (the store has no
// multi-key transaction): MACs are claimed with create-only writes before
// the machine lists them, and serial and UUID index records are written
// before the machine and checked against it on read (docs/architecture.md,
// "Index records").
//
// It imports the api, the store contract and the internal leaves apierr,
// lograte and watchstream, and of its sub-packages only inventory/timeline,
// which it composes (inventory/bmc builds on it, inventory/pool lives beside
// it); never lifecycle, ipmi or boot.
package inventory
