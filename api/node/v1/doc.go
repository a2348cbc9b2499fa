// Package nodev1 is the generated corral.node.v1 API that agents on machines call.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package nodev1
