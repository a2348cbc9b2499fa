// Package lifecycle drives physical machines through the states of
// docs/architecture.md once inventory knows them: accept (INVENTORIED or FAILED →
// INSTALLING) sends an install plan over the discovery agent's session
// (re-sent on reconnect and by the reconciler); progress of the current
// install id moves the install step; done sets boot intent hypervisor and
// has the agent kexec into the hypervisor image when it can (kexec.go),
// else reboots the machine (BMC next-boot PXE + power cycle, else the
// session's Reboot command) — as it does when the kexec fails or its node
// is not READY in time; the machine's Node READY makes it DEPLOYED; an error,
// the install timeout or the boot watchdog make it FAILED. Reprovision
// goes back to DISCOVERED with a pending disk wipe; MAINTENANCE holds a
// machine away from all of this; auto-accept accepts matching machines as
// they register. Release with an erase (release.go, erase.go) makes a
// machine RELEASING, hands its ErasePlan to the discovery agent (after a
// power cycle into network boot when the agent is not connected) and
// makes it READY once erased, FAILED on an error or the erase timeout;
// the expiry sweep releases through it at the pool's erase level.
//
// It owns the agent edge (AgentService: Register, the command Session,
// Join wired by cmd) and the registry of connected agent sessions, and
// implements the lifecycle verbs of MachineService (Accept, Reprovision,
// SetMaintenance, SetPower arming the boot watchdog, DeleteMachine
// revoking the node's certificates) as inventory.LifecycleVerbs, which
// inventory's one MachineService implementation delegates to.
//
// It reaches inventory, the node pool, the BMC and the CA only through the
// small interfaces declared here (Machines, Events, Nodes, Power,
// NodeIdentity); inventory holds no reference back. Every machine change
// is one compare-and-swap through Machines.UpdateMachine whose mutation
// moves the state with inventory.Transition (never by assignment) and
// re-checks what it acts on, so two reconcilers never apply one
// transition twice. It imports the api, the error classes and inventory's
// types and functions (selectors, the register hook, BootRequest,
// Transition); never the store.
package lifecycle
