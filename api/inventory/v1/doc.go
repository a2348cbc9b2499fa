// Package inventoryv1 is the generated corral.inventory.v1 API: machines, facts, BMC, power and boot timeline.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package inventoryv1
