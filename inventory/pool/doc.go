// Package pool is the node pool: hypervisor Nodes with their compute and
// storage budgets, and Networks with their address budgets (IPAM). It
// implements corral.pool.v1 NodeService and NetworkService with n0stack's
// semantics plus Corral's fixes: real scheduling, IPv4/IPv6
// auto-allocation, generated MACs with a collision check, and
// deletion refused while reservations exist.
//
// Every mutation is an atomic read-modify-write of one record, checked
// against its store revision (store/record.Mutate): inside the store's own
// commit where the store supports it (bbolt), else a compare-and-swap retry
// loop (etcd). There is no in-process lock table, so two appliances sharing
// one store cannot double-book.
//
// It imports the store contract and the generated API only; gRPC status
// codes are produced in one place, toStatus in grpc.go.
package pool
