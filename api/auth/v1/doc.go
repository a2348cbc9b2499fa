// Package authv1 declares roles, the per-RPC access option and the stored token record.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package authv1
