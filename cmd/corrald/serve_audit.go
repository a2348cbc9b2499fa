package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/spf13/cobra"
)

// addAuditFlags registers the audit stream's bounds.
func addAuditFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int("audit-max-events", appliance.DefaultAuditMaxEvents, "audit events kept at most; the oldest are purged past it (env CORRAL_AUDIT_MAX_EVENTS)")
	f.Duration("audit-max-age", appliance.DefaultAuditMaxAge, "audit events older than this are purged (env CORRAL_AUDIT_MAX_AGE)")
	f.Int("audit-queue", appliance.DefaultAuditQueue, "audit events waiting to be stored at most; past it they are dropped and counted, never slowing a call (env CORRAL_AUDIT_QUEUE)")
}

// auditConfig reads the audit flags (appliance.New refuses bad values).
func auditConfig(cmd *cobra.Command) appliance.AuditConfig {
	f := cmd.Flags()
	var c appliance.AuditConfig
	c.MaxEvents, _ = f.GetInt("audit-max-events")
	c.MaxAge, _ = f.GetDuration("audit-max-age")
	c.Queue, _ = f.GetInt("audit-queue")
	return c
}
