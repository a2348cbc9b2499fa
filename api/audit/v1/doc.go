// Package auditv1 is the generated corral.audit.v1 API: the audit stream of mutating calls (AuditEvent, ListEvents, WatchEvents).
// Generated code lives beside this file (buf generate); it imports only
// protobuf and gRPC.
package auditv1
