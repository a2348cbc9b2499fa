package audit

import (
	"context"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// auditServer is AuditService: the audit stream read back.
type auditServer struct {
	auditv1.UnimplementedAuditServiceServer
	a *Recorder
}

// ListEvents answers the newest limit events, or with page_size or
// page_token one page of them oldest first (listPage).
func (s *auditServer) ListEvents(ctx context.Context, req *auditv1.ListEventsRequest) (*auditv1.ListEventsResponse, error) {
	if paged(req) {
		evs, next, err := s.a.listPage(ctx, req)
		if err != nil {
			return nil, apierr.ToStatus(err)
		}
		return &auditv1.ListEventsResponse{Events: evs, NextPageToken: next}, nil
	}
	evs, err := s.a.list(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &auditv1.ListEventsResponse{Events: evs}, nil
}
