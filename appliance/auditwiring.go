package appliance

import (
	"context"

	"github.com/corralhq/corral/appliance/audit"
	"github.com/corralhq/corral/inventory"
)

// AuditConfig bounds the audit stream (package audit).
type AuditConfig = audit.Config

// Audit defaults (package audit).
const (
	DefaultAuditQueue     = audit.DefaultQueue
	DefaultAuditMaxEvents = audit.DefaultMaxEvents
	// DefaultAuditMaxAgentEvents caps the boot LAN's records (agents,
	// node certificates, unauthenticated callers) apart from the
	// operators'.
	DefaultAuditMaxAgentEvents = audit.DefaultMaxAgentEvents
	DefaultAuditMaxAge         = audit.DefaultMaxAge
)

// initAudit prepares the audit stream, before the gRPC server exists: its
// writer runs on every appliance, its purge on the leader.
func (s *Server) initAudit() error {
	a, err := audit.New(s.cfg.Audit, audit.Deps{Store: s.store, Appliance: s.cfg.Fleet.Name,
		Timeline: inventoryTimeline{inv: s.inv}, Logger: s.log.With("component", "audit")})
	if err != nil {
		return err
	}
	s.audit = a
	// What the evidence (the audit, the boot timeline) did not keep is
	// counted in /metrics.
	a.CountInto(s.obs)
	countTimeline(s.obs, s.inv)
	s.addComponent("audit-writer", a.Run)
	s.addSingleton("audit-purge", a.RunPurge)
	return nil
}

// inventoryTimeline is the inventory's boot timeline, where the audit puts
// machine calls.
type inventoryTimeline struct{ inv *inventory.Inventory }

func (t inventoryTimeline) MachineMAC(ctx context.Context, name string) string {
	if name == "" {
		return ""
	}
	m, err := t.inv.GetMachine(ctx, name)
	if err != nil {
		return ""
	}
	if mac := m.GetBootMac(); mac != "" {
		return mac
	}
	if macs := m.GetMacs(); len(macs) > 0 {
		return macs[0]
	}
	return ""
}

func (t inventoryTimeline) Event(mac, source, event, detail string, attrs map[string]string) {
	t.inv.Event(mac, source, event, detail, attrs)
}
