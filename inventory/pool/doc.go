// Package pool is the node pool: hypervisor Nodes with their compute and
// storage budgets, and Networks with their address budgets (IPAM). It
// implements corral.pool.v1 NodeService and NetworkService with n0stack's
// semantics plus Corral's fixes: real scheduling, IPv4/IPv6
// auto-allocation, generated MACs with a collision check, and
// deletion refused while reservations exist.
//
// Every mutation is a compare-and-swap retry loop on the record's store
// revision (store/record.Update); there is no in-process lock table, so two
// appliances sharing one store cannot double-book.
//
// It imports the store contract and the generated API only; gRPC status
// codes are produced in one place, toStatus in grpc.go.
package pool
