// Package watchv1 is the generated corral.watch.v1 API: what every Watch RPC shares (EventType and the stream's contract).
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package watchv1
