package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"golang.org/x/sync/errgroup"
)

// auditIDTime is the id's time part: fixed width, so key order is time
// order; its first 11 characters ("20060102T15") name the hour.
const (
	auditIDTime   = "20060102T150405.000000000Z"
	auditHourLen  = len("20060102T15")
	auditListMax  = 5000
	auditListDef  = 500
	auditSinceDef = 24 * time.Hour
	// maxAuditFilterBytes bounds a ListEvents filter string.
	maxAuditFilterBytes = 512
)

// Timeline is where machine calls go besides the audit stream.
type Timeline interface {
	// MachineMAC returns the MAC whose timeline is the machine's ("" when
	// it has none or cannot be read).
	MachineMAC(ctx context.Context, name string) string
	// Event appends an entry to mac's timeline; it never blocks.
	Event(mac, source, event, detail string, attrs map[string]string)
}

// agentIDSuffix ends the id of a boot-LAN event (the retention class of
// agents, node certificates and unauthenticated callers; see audit.go).
// It follows the time, so key order stays time order.
const agentIDSuffix = "-lan"

// newID returns a fresh time-ordered event id for at, of the boot-LAN
// class when bootLAN.
func (a *Recorder) newID(at time.Time, bootLAN bool) string {
	id := fmt.Sprintf("%s-%s-%08x", at.UTC().Format(auditIDTime), a.instance, a.seq.Add(1))
	if bootLAN {
		id += agentIDSuffix
	}
	return id
}

// bootLANKey says whether an event key is of the boot-LAN class.
func bootLANKey(key string) bool { return strings.HasSuffix(key, agentIDSuffix) }

// Run stores queued events until ctx ends, then what is still queued
// (bounded by auditWriteTimeout), and returns nil.
func (a *Recorder) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			a.drain()
			return nil
		case it := <-a.queue:
			a.write(a.collect(it))
		}
	}
}

// collect returns it and whatever else is queued, up to auditBatch.
func (a *Recorder) collect(it auditItem) []auditItem {
	batch := []auditItem{it}
	for len(batch) < auditBatch {
		select {
		case it := <-a.queue:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}

func (a *Recorder) drain() {
	for {
		select {
		case it := <-a.queue:
			a.write(a.collect(it))
		default:
			return
		}
	}
}

// write stores a batch with concurrent Puts (the bolt store commits them
// together), then puts machine calls on their timelines and releases
// flush markers.
func (a *Recorder) write(batch []auditItem) {
	ctx, cancel := context.WithTimeout(context.Background(), auditWriteTimeout)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(auditWriters)
	for _, it := range batch {
		if it.ev == nil {
			continue
		}
		g.Go(func() error {
			if _, err := record.Put(ctx, a.st, auditPrefix+it.ev.GetId(), it.ev, 0); err != nil {
				n := a.failed.Add(1)
				a.failures.Add(1, func(since int64) {
					a.log.Warn("audit: cannot store events", "err", err, "failed_since_last_log", since, "failed_total", n)
				})
			} else if bootLANKey(it.ev.GetId()) && a.agentWrites.Add(1) == int64(a.cfg.MaxAgentEvents/4+1) {
				select {
				case a.kick <- struct{}{}:
				default:
				}
			}
			if it.verb != "" && a.timeline != nil {
				mac := it.mac
				if mac == "" {
					mac = a.timeline.MachineMAC(ctx, it.ev.GetMachine())
				}
				if mac != "" {
					a.timeline.Event(mac, "api", it.verb+" by "+it.ev.GetWho(), outcome(it.ev),
						map[string]string{"method": it.ev.GetMethod(), "code": it.ev.GetCode(), "audit_id": it.ev.GetId()})
				}
			}
			return nil
		})
	}
	_ = g.Wait() // the writers return nil: a failed Put is counted and logged above
	for _, it := range batch {
		if it.flush != nil {
			close(it.flush)
		}
	}
}

// outcome is an event's result in words: "OK" or "<code>: <message>".
func outcome(ev *auditv1.AuditEvent) string {
	if ev.GetMessage() == "" {
		return ev.GetCode()
	}
	return ev.GetCode() + ": " + ev.GetMessage()
}

// Flush waits until every event queued before it is stored.
func (a *Recorder) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case a.queue <- auditItem{flush: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RunPurge applies the retention every auditPurgeInterval, and early when
// this appliance's writer has stored a quarter of MaxAgentEvents boot-LAN
// events since the last purge (a singleton: the leader's job).
func (a *Recorder) RunPurge(ctx context.Context) error {
	t := time.NewTicker(auditPurgeInterval)
	defer t.Stop()
	for {
		a.agentWrites.Store(0)
		n, err := a.purge(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			a.log.Warn("audit purge failed", "err", err)
		case n > 0:
			a.log.Info("audit events purged", "count", n, "max_events", a.cfg.MaxEvents, "max_agent_events", a.cfg.MaxAgentEvents,
				"max_age", a.cfg.MaxAge.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-a.kick:
		}
	}
}

// purge deletes the events older than MaxAge and, in each retention
// class, the oldest past its cap (MaxEvents of people and appliances,
// MaxAgentEvents of the boot LAN), and returns how many it deleted. It
// reads the whole stream once (one List: a few tens of MB at the default
// caps, every auditPurgeInterval).
func (a *Recorder) purge(ctx context.Context) (int, error) {
	kvs, err := a.st.List(ctx, auditPrefix)
	if err != nil {
		return 0, err
	}
	cutoff := auditPrefix + a.now().Add(-a.cfg.MaxAge).UTC().Format(auditIDTime)
	agents := 0
	for _, kv := range kvs {
		if bootLANKey(kv.Key) {
			agents++
		}
	}
	// excess is how many of each class's oldest go; keys are in time
	// order, so a class's first excess keys are its oldest.
	excessOps, excessAgents := len(kvs)-agents-a.cfg.MaxEvents, agents-a.cfg.MaxAgentEvents
	var g errgroup.Group
	g.SetLimit(auditWriters)
	var ops, lan int
	for _, kv := range kvs {
		excess, counter, seen := &excessOps, &a.purgedOps, &ops
		if bootLANKey(kv.Key) {
			excess, counter, seen = &excessAgents, &a.purgedAgents, &lan
		}
		old := kv.Key < cutoff
		if !old && *excess <= 0 {
			if excessOps <= 0 && excessAgents <= 0 {
				break // the rest are young enough and each class within its cap
			}
			continue
		}
		*excess--
		*seen++
		g.Go(func() error {
			err := a.st.Delete(ctx, kv.Key, kv.Revision)
			if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
				return nil // another appliance's purge got there first
			}
			if err == nil {
				counter.Add(1)
			}
			return err
		})
	}
	return ops + lan, g.Wait()
}

// list answers ListEvents: the newest limit events at or after since that
// match the filters, oldest first. It reads hour by hour from the newest,
// so a recent question reads little whatever the stream holds.
func (a *Recorder) list(ctx context.Context, req *auditv1.ListEventsRequest) ([]*auditv1.AuditEvent, error) {
	limit := int(req.GetLimit())
	switch {
	case limit == 0:
		limit = auditListDef
	case limit > auditListMax:
		return nil, apierr.Invalidf("limit %d is over the maximum %d", limit, auditListMax)
	}
	for name, v := range map[string]string{"object": req.GetObject(), "machine": req.GetMachine(), "method": req.GetMethod()} {
		if len(v) > maxAuditFilterBytes {
			return nil, apierr.Invalidf("%s filter is %d bytes (at most %d)", name, len(v), maxAuditFilterBytes)
		}
	}
	now := a.now()
	since := now.Add(-auditSinceDef)
	if req.GetSince() != nil {
		if err := req.GetSince().CheckValid(); err != nil {
			return nil, apierr.Invalidf("since: %v", err)
		}
		since = req.GetSince().AsTime()
	}
	// Nothing older than the retention is kept (and a day's grace for
	// clocks): no need to read the hours before it.
	first := since
	if oldest := now.Add(-a.cfg.MaxAge - 24*time.Hour); first.Before(oldest) {
		first = oldest
	}
	var hours [][]*auditv1.AuditEvent // newest hour first
	count := 0
	// An appliance whose clock runs a little ahead may have written into
	// the next hour.
	for h := now.UTC().Truncate(time.Hour).Add(time.Hour); !h.Before(first.UTC().Truncate(time.Hour)) && count < limit; h = h.Add(-time.Hour) {
		kvs, err := a.st.List(ctx, auditPrefix+h.Format(auditIDTime)[:auditHourLen])
		if err != nil {
			return nil, err
		}
		var got []*auditv1.AuditEvent
		for _, kv := range kvs {
			ev := &auditv1.AuditEvent{}
			if err := record.Unmarshal(kv.Value, ev); err != nil {
				a.log.Warn("audit: unreadable event skipped", "key", kv.Key, "err", err)
				continue
			}
			if ev.GetAt().AsTime().Before(since) ||
				req.GetObject() != "" && ev.GetObject() != req.GetObject() ||
				req.GetMachine() != "" && ev.GetMachine() != req.GetMachine() ||
				req.GetMethod() != "" && ev.GetMethod() != req.GetMethod() && !strings.HasSuffix(ev.GetMethod(), "/"+req.GetMethod()) {
				continue
			}
			got = append(got, ev)
		}
		hours = append(hours, got)
		count += len(got)
	}
	out := make([]*auditv1.AuditEvent, 0, min(count, limit))
	for i := len(hours) - 1; i >= 0; i-- {
		out = append(out, hours[i]...)
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
