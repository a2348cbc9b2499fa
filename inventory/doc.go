// Package inventory owns physical machines: identity (by MAC now; serial
// first once discovery reports), lifecycle state, boot intent, BMC
// attachment and the per-MAC boot timeline that answers "why didn't it
// boot?". It implements corral.inventory.v1 MachineService at its gRPC edge
// (grpc.go). The node pool lives in inventory/pool.
//
// Every machine change is a compare-and-swap on the record's store revision
// (store/record.Update); the MAC index is a set of records claimed with
// create-only writes. It imports the api and the store contract only.
package inventory
