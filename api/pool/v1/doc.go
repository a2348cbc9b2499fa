// Package poolv1 is the generated corral.pool.v1 API: nodes, networks and their budgets (n0stack pool.v0 shape).
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package poolv1
