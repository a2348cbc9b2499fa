package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/pflag"
)

// addAuditFlags registers the audit stream's bounds (appliance.New refuses
// bad values).
func addAuditFlags(f *pflag.FlagSet, c *appliance.AuditConfig) {
	f.IntVar(&c.MaxEvents, "audit-max-events", appliance.DefaultAuditMaxEvents, "audit events of people and appliances (operator, admin, viewer tokens; appliance certificates) kept at most; the oldest are purged past it, never for the boot LAN's events (env CORRAL_AUDIT_MAX_EVENTS)")
	f.IntVar(&c.MaxAgentEvents, "audit-max-agent-events", appliance.DefaultAuditMaxAgentEvents, "audit events of the boot LAN (agents, node certificates, unauthenticated callers) kept at most, apart from the operators'; the oldest are purged past it (env CORRAL_AUDIT_MAX_AGENT_EVENTS)")
	f.DurationVar(&c.MaxAge, "audit-max-age", appliance.DefaultAuditMaxAge, "audit events older than this are purged (env CORRAL_AUDIT_MAX_AGE)")
	f.IntVar(&c.Queue, "audit-queue", appliance.DefaultAuditQueue, "audit events waiting to be stored at most; past it they are dropped and counted, never slowing a call (env CORRAL_AUDIT_QUEUE)")
}
