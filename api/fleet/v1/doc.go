// Package fleetv1 is the generated corral.fleet.v1 API of several appliances
// sharing one store: runner records, assignments, the cluster secrets and
// ApplianceService. Generated code lives beside this file (buf generate); it
// imports only protobuf and gRPC.
package fleetv1
