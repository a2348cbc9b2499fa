// Package consolev1 is the generated corral.console.v1 API: a machine's serial console as one bidirectional stream (ConsoleService.Attach).
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package consolev1
