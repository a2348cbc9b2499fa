// Package appliance is the appliance side of the hypervisor: the
// BlockStorageService, VirtualMachineService and ImageService (n0stack
// semantics) and the reconciler that keeps their records
// honest against the nodes.
//
// Records live in the shared store (/provisioning/block_storages/,
// /provisioning/virtual_machines/, /deployment/images/) and change only by
// compare-and-swap (store/record.Update). Budgets and addresses are booked
// in the node pool (inventory/pool). Volumes and VMs are made on the nodes
// through their HypervisorService, reached through a NodeDialer.
//
// Long operations persist the record as PENDING with an owner and a
// deadline before any side effect, push the inverse of every step on a
// compensation stack that unwinds on error, and leave enough in the record
// and in the pool's reserved_by annotations for the reconciler (Run) to
// roll back, or forward, a PENDING record whose owner died. The reconciler
// also reflects what nodes report about their VMs and decommissions VMs and
// volumes whose corral/expires_at has passed.
//
// It imports the generated API, the store contract, the pool and
// internal/apierr; gRPC status codes are produced only in grpc.go. Nothing
// reachable from cmd/corral-node may import it (it reaches the store).
package appliance
