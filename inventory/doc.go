// Package inventory owns physical machines: identity (serial first, then
// system UUID, then MAC), facts and their dated history, the MAC, serial
// and UUID indexes, boot intent, BMC attachment and control (enrolment,
// sealed credentials, power, boot device), and the per-MAC boot timeline
// that answers "why didn't it boot?". It implements the read, enrol and
// power part of corral.inventory.v1 MachineService at its gRPC edge
// (grpc.go). The node pool lives in inventory/pool.
//
// The machine lifecycle (accept, install, watchdog, reprovision,
// maintenance, agent sessions) lives in package lifecycle, which consumes
// this package through interfaces it declares; inventory knows nothing of
// it. Register takes a hook that runs inside its one machine mutation, so
// a discovery report and what the lifecycle decides about it are written
// together.
//
// Every machine change is a compare-and-swap on the record's store revision
// (store/record.Update); the MAC index is a set of records claimed with
// create-only writes. It imports the api, the error classes and the store
// contract only.
package inventory
