// Package hypervisorv1 is the generated corral.hypervisor.v1 API that the appliance calls on each node over mTLS.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package hypervisorv1
