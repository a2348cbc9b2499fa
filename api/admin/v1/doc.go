// Package adminv1 is the generated corral.admin.v1 API: appliance administration (the online, encrypted backup).
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package adminv1
