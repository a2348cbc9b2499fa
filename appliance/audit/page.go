package audit

import (
	"context"
	"strconv"
	"strings"
	"time"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// pageBatch is how many events one store read takes while a page fills.
const pageBatch = 512

// paged reports whether a ListEvents request asks for pages.
func paged(req *auditv1.ListEventsRequest) bool {
	return req.GetPageSize() != 0 || req.GetPageToken() != ""
}

// listPage answers a paged ListEvents: the events at or after since that
// match the filters, oldest first, from the token's position on, at most
// page_size (default auditListDef, at most auditListMax). It reads the
// stream a bounded range at a time; a full page always carries a token,
// so the last page may be empty.
func (a *Recorder) listPage(ctx context.Context, req *auditv1.ListEventsRequest) ([]*auditv1.AuditEvent, string, error) {
	for name, v := range map[string]string{"object": req.GetObject(), "machine": req.GetMachine(), "method": req.GetMethod()} {
		if len(v) > maxAuditFilterBytes {
			return nil, "", apierr.Invalidf("%s filter is %d bytes (at most %d)", name, len(v), maxAuditFilterBytes)
		}
	}
	sinceSet := ""
	since := a.now().Add(-auditSinceDef)
	if req.GetSince() != nil {
		if err := req.GetSince().CheckValid(); err != nil {
			return nil, "", apierr.Invalidf("since: %v", err)
		}
		since = req.GetSince().AsTime()
		sinceSet = strconv.FormatInt(since.UnixNano(), 10)
	}
	filter := paging.Fingerprint(sinceSet, req.GetObject(), req.GetMachine(), req.GetMethod())
	tok, err := paging.Decode(req.GetPageToken(), filter)
	if err != nil {
		return nil, "", err
	}
	size := paging.Size(req.GetPageSize(), auditListDef, auditListMax)
	after := auditPrefix + since.UTC().Format(auditIDTime)
	if tok.After != "" {
		after = auditPrefix + tok.After
	}
	var out []*auditv1.AuditEvent
	for {
		kvs, _, err := store.ListPageOf(ctx, a.st, auditPrefix, after, pageBatch)
		if err != nil {
			return nil, "", err
		}
		for _, kv := range kvs {
			ev := &auditv1.AuditEvent{}
			if err := record.Unmarshal(kv.Value, ev); err != nil {
				a.log.Warn("audit: unreadable event skipped", "key", kv.Key, "err", err)
				continue
			}
			if !matches(ev, req, since) {
				continue
			}
			out = append(out, ev)
			if len(out) == size {
				return out, paging.Encode(paging.Token{After: strings.TrimPrefix(kv.Key, auditPrefix), Filter: filter}), nil
			}
		}
		if len(kvs) < pageBatch {
			return out, "", nil
		}
		after = kvs[len(kvs)-1].Key
	}
}

// matches reports whether ev passes a ListEvents request's filters.
func matches(ev *auditv1.AuditEvent, req *auditv1.ListEventsRequest, since time.Time) bool {
	return !ev.GetAt().AsTime().Before(since) &&
		(req.GetObject() == "" || ev.GetObject() == req.GetObject()) &&
		(req.GetMachine() == "" || ev.GetMachine() == req.GetMachine()) &&
		(req.GetMethod() == "" || ev.GetMethod() == req.GetMethod() || strings.HasSuffix(ev.GetMethod(), "/"+req.GetMethod()))
}
