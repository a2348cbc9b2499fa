// Package deploy owns `corral do`, the executor of n0cli-compatible DAG
// files (a YAML map of task name to {type, action, args, depends_on,
// ignore_error} where each task is one unary RPC of a Corral API service),
// and the Registry that both `corral do` and `corral apply` resolve
// through.
//
// Registry resolves a task's type and action from the gRPC service
// descriptors registered in protoregistry.GlobalFiles (type X is service
// XService of a corral.<area>.v1 package; action is the RPC name), so
// every unary RPC of every linked service is reachable without a
// hand-written table. On top of the types it holds the resource kinds
// ("virtual_machine", alias "vm"): the names apply documents and the
// command line use, each served by one type, with the action a document
// of the kind is sent to. Both commands decode requests with one strict
// field check (unknown fields at any depth are errors naming the field).
//
// Parse decodes a DAG file strictly and validates all of it before
// anything runs: types, actions, args decoded with protojson, missing
// dependencies and cycles. Registry.Document decodes one apply document.
// Runner executes a Plan with a parallelism limit, fail-fast with in-flight
// drain, ignore_error and a per-task deadline, reporting progress events.
//
// The package sends RPCs through the one-method Invoker interface; it
// imports only the api packages and gRPC/protobuf, never the server-side
// packages (inventory, store, boot, ipmi, hypervisor) or the CLI.
package deploy
