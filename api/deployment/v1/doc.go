// Package deploymentv1 is the generated corral.deployment.v1 API: images and the volumes generated from them.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package deploymentv1
