// Package inventory owns physical machines: identity (by MAC now; serial
// first once discovery reports), lifecycle state, boot intent, BMC
// attachment and the per-MAC boot timeline that answers "why didn't it
// boot?". It implements corral.inventory.v1 MachineService at its gRPC edge
// (grpc.go). The node pool lives in inventory/pool.
//
// Lifecycle (lifecycle.go) drives the machine states of DESIGN.md §4:
// Accept (INVENTORIED or FAILED → INSTALLING) sends an install plan over
// the agent's session (re-sent on reconnect and by its reconciler),
// progress of the current install id moves the install step, done sets
// boot intent hypervisor and reboots (BMC PXE + cycle, else the session's
// Reboot), the machine's Node READY makes it DEPLOYED; an error, the
// install timeout or the boot watchdog make it FAILED. Reprovision goes
// back to DISCOVERED with a pending disk wipe; MAINTENANCE holds a machine
// away from all of this. The pool and the CA reach it through the small
// Nodes and NodeIdentity interfaces.
//
// Every machine change is a compare-and-swap on the record's store revision
// (store/record.Update); the MAC index is a set of records claimed with
// create-only writes. It imports the api and the store contract only.
package inventory
