package audit

import (
	auditv1 "github.com/corralhq/corral/api/audit/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/watchstream"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// auditWatchInitial is how many of the newest events (of the last
// auditSinceDef) a watch from revision 0 sends before SYNCED.
const auditWatchInitial = auditListDef

// WatchEvents streams new audit events (the corral.watch.v1 contract):
// from revision 0 the newest events of the last 24 h first, then SYNCED,
// then each event as it is stored. The retention purge is not sent: a
// purged event was already seen or is older than the watcher cares.
func (s *auditServer) WatchEvents(req *auditv1.WatchEventsRequest, stream auditv1.AuditService_WatchEventsServer) error {
	a := s.a
	// Events older than a day are skipped by key, before decoding.
	oldest := auditPrefix + a.now().Add(-auditSinceDef).UTC().Format(auditIDTime)
	err := watchstream.Run(stream.Context(), watchstream.Config[*auditv1.AuditEvent]{
		Name:         "audit events",
		Store:        a.st,
		Prefix:       auditPrefix,
		FromRevision: req.GetFromRevision(),
		Logger:       a.log,
		Decode: func(kv store.KV) (*auditv1.AuditEvent, bool, error) {
			if req.GetFromRevision() == 0 && kv.Key < oldest {
				return nil, false, nil
			}
			ev := &auditv1.AuditEvent{}
			if err := record.Unmarshal(kv.Value, ev); err != nil {
				return nil, false, err
			}
			return ev, true, nil
		},
		Deleted: func(string) (*auditv1.AuditEvent, bool) { return nil, false },
		Initial: func(evs []*auditv1.AuditEvent) []*auditv1.AuditEvent {
			if len(evs) > auditWatchInitial {
				evs = evs[len(evs)-auditWatchInitial:]
			}
			return evs
		},
	}, func(ev watchstream.Event[*auditv1.AuditEvent]) error {
		typ := ev.Type
		if typ == watchv1.EventType_MODIFIED {
			// Events are written once and never changed: what a resumed
			// watcher cannot tell from new is new.
			typ = watchv1.EventType_ADDED
		}
		return stream.Send(&auditv1.AuditStreamEvent{Type: typ, Revision: ev.Revision, Event: ev.Object})
	})
	return apierr.ToStatus(err)
}
