// Package storev1 is the generated corral.store.v1 envelope every stored value is wrapped in.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package storev1
