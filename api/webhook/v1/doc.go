// Package webhookv1 is the generated corral.webhook.v1 API: webhook receivers for event export.
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package webhookv1
