// Package provisioningv1 is the generated corral.provisioning.v1 API: block storage and virtual machines.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package provisioningv1
