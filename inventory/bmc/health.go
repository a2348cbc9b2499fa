package bmc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// FlagHealth starts a machine flag set when a BMC sensor is past a
// threshold (warning or critical) or the BMC's event log holds a critical
// entry; it is cleared when every sensor is back and the log holds none
// (clearing the BMC's event log clears a logged failure).
const FlagHealth = "bmc-health"

// HealthLogEntry is one BMC event log entry.
type HealthLogEntry struct {
	ID       uint32
	Time     time.Time
	Critical bool
	Text     string
}

// Health is one read of a BMC's sensors and event log.
type Health struct {
	Sensors []*inventoryv1.BmcSensor
	Dropped int
	// LogAddedAt is the log's most recent addition; Log is its newest
	// entries, read only when LogRead (the log changed since logSeen).
	LogAddedAt time.Time
	LogRead    bool
	Log        []HealthLogEntry
}

// HealthReader reads a BMC's sensors and event log; cmd wires the ipmi
// package to it. logSeen is the LogAddedAt of the last read: an
// unchanged log need not be read again.
type HealthReader interface {
	Health(ctx context.Context, t Target, logSeen time.Time) (Health, Result, error)
}

// HealthTargets names the machines with an enrolled BMC (as
// PowerTargets).
func (c *Service) HealthTargets(ctx context.Context) ([]string, error) { return c.PowerTargets(ctx) }

// RefreshHealth reads machine name's BMC sensors and event log, hands the
// readings to Config.OnHealth (the metrics), and writes the machine only
// when what it records changed: a sensor's status, the set of sensors,
// the log. A status change or a new critical log entry sets or clears
// FlagHealth with a timeline entry and a log line. IPMI and Redfish
// BMCs alike (the adapter reads each in its own way).
func (c *Service) RefreshHealth(ctx context.Context, name string) error {
	if c.cfg.Health == nil {
		return nil
	}
	m, t, err := c.target(ctx, name)
	if err != nil {
		return err
	}
	old := m.GetBmc().GetHealth()
	h, res, err := c.cfg.Health.Health(ctx, t, old.GetLogAddedAt().AsTime())
	if err != nil {
		return fmt.Errorf("health of %s: %w", name, err)
	}
	if c.cfg.OnHealth != nil {
		c.cfg.OnHealth(name, h)
	}
	rec := healthRecord(old, h)
	if sameHealth(old, rec) {
		return nil
	}
	rec.ChangedAt = timestamppb.New(c.cfg.Now())
	flag := healthFlag(rec)
	var oldFlag string
	nm, err := c.inv.UpdateMachine(context.WithoutCancel(ctx), name, func(m *inventoryv1.Machine) error {
		if m.GetBmc().GetUsername() == "" || sameHealth(m.GetBmc().GetHealth(), rec) {
			return errSkip
		}
		oldFlag = flagWith(m.GetFlags(), FlagHealth)
		m.Bmc.Health = proto.CloneOf(rec)
		m.Flags = withoutFlag(m.GetFlags(), FlagHealth)
		if flag != "" {
			m.Flags = append(m.Flags, flag)
		}
		return nil
	})
	switch {
	case errors.Is(err, errSkip):
		return nil
	case err != nil:
		return err
	}
	if c.cfg.OnHealthWrite != nil {
		c.cfg.OnHealthWrite()
	}
	if flag != oldFlag {
		if flag != "" {
			c.event(nm, FlagHealth, flag, res)
			c.log.Warn("BMC health", "machine", name, "flag", flag)
		} else {
			c.event(nm, "bmc-health-ok", "BMC sensors and event log are back to normal", res)
			c.log.Info("BMC health back to normal", "machine", name)
		}
	}
	return nil
}

// healthRecord is what h makes of the stored record old: the sensors as
// read, the log's newest critical entry (kept from old while the log is
// unchanged), and the worst status.
func healthRecord(old *inventoryv1.BmcHealth, h Health) *inventoryv1.BmcHealth {
	rec := &inventoryv1.BmcHealth{Sensors: h.Sensors, Dropped: uint32(h.Dropped), LogAddedAt: timestamppb.New(h.LogAddedAt),
		LogCritical: old.GetLogCritical(), LogCriticalId: old.GetLogCriticalId()}
	if h.LogRead {
		rec.LogCritical, rec.LogCriticalId = "", 0
		for _, e := range h.Log {
			if e.Critical {
				rec.LogCritical, rec.LogCriticalId = e.Text, e.ID
			}
		}
	}
	rec.Status = "ok"
	for _, s := range rec.Sensors {
		if s.GetStatus() == "critical" || s.GetStatus() == "warning" && rec.Status == "ok" {
			rec.Status = s.GetStatus()
		}
	}
	if rec.LogCritical != "" {
		rec.Status = "critical"
	}
	return rec
}

// sameHealth compares what a health record says, not its values: a
// temperature that moves within its thresholds is no change (the metrics
// carry it).
func sameHealth(a, b *inventoryv1.BmcHealth) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if a.GetStatus() != b.GetStatus() || a.GetDropped() != b.GetDropped() || a.GetLogCriticalId() != b.GetLogCriticalId() ||
		a.GetLogCritical() != b.GetLogCritical() || !a.GetLogAddedAt().AsTime().Equal(b.GetLogAddedAt().AsTime()) {
		return false
	}
	return slices.EqualFunc(a.GetSensors(), b.GetSensors(), func(x, y *inventoryv1.BmcSensor) bool {
		return x.GetName() == y.GetName() && x.GetKind() == y.GetKind() && x.GetUnit() == y.GetUnit() &&
			x.GetStatus() == y.GetStatus() && x.GetThreshold() == y.GetThreshold()
	})
}

// healthFlag is FlagHealth's text for rec ("" when all is well): the
// worst sensor (critical before warning), then the log.
func healthFlag(rec *inventoryv1.BmcHealth) string {
	if rec.GetStatus() == "ok" {
		return ""
	}
	rank := map[string]int{"critical": 2, "warning": 1}
	var worst *inventoryv1.BmcSensor
	for _, s := range rec.GetSensors() {
		if rank[s.GetStatus()] > rank[worst.GetStatus()] {
			worst = s
		}
	}
	var what []string
	if worst != nil {
		what = append(what, fmt.Sprintf("%s %g %s past %s", worst.GetName(), worst.GetValue(), worst.GetUnit(), cmp.Or(worst.GetThreshold(), "a threshold")))
	}
	if rec.GetLogCritical() != "" {
		what = append(what, fmt.Sprintf("event log entry %d: %s", rec.GetLogCriticalId(), rec.GetLogCritical()))
	}
	out := FlagHealth + ": " + rec.GetStatus() + ": "
	for i, w := range what {
		if i > 0 {
			out += "; "
		}
		out += w
	}
	return out
}
