package audit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store/mem"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestAuditListPages: paged, ListEvents returns every matching event
// since, oldest first, each once; tokens of another filter are refused.
func TestAuditListPages(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	a.run(t)
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for i := range 120 {
		a.set(t0.Add(-20*time.Hour + time.Duration(i)*10*time.Minute))
		a.call("/corral.inventory.v1.MachineService/SetPower", &inventoryv1.SetPowerRequest{Name: fmt.Sprintf("m-%d", i%3)}, nil)
	}
	a.set(t0)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := &auditServer{a: a.Recorder}
	since := timestamppb.New(t0.Add(-10 * time.Hour))
	for _, size := range []int32{1, 7, 60, 5000} {
		var got []*auditv1.AuditEvent
		err := paging.All(t.Context(), 0, func(ctx context.Context, tok string) ([]*auditv1.AuditEvent, string, error) {
			resp, err := srv.ListEvents(ctx, &auditv1.ListEventsRequest{Since: since, Machine: "m-1", PageSize: size, PageToken: tok})
			return resp.GetEvents(), resp.GetNextPageToken(), err
		}, func(ev *auditv1.AuditEvent) error { got = append(got, ev); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 20 {
			t.Errorf("pages of %d: %d events, want 20", size, len(got))
		}
		for k := 1; k < len(got); k++ {
			if !got[k-1].GetAt().AsTime().Before(got[k].GetAt().AsTime()) {
				t.Errorf("pages of %d: event %d not after event %d", size, k, k-1)
			}
		}
	}
	_, tok, err := a.listPage(t.Context(), &auditv1.ListEventsRequest{Since: since, PageSize: 2})
	if err != nil || tok == "" {
		t.Fatalf("first page: token %q, %v", tok, err)
	}
	if _, _, err := a.listPage(t.Context(), &auditv1.ListEventsRequest{Since: since, Machine: "m-2", PageToken: tok}); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("a token with another filter: %v, want ErrInvalid", err)
	}
	if _, _, err := a.listPage(t.Context(), &auditv1.ListEventsRequest{PageToken: "zz"}); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("a garbled token: %v, want ErrInvalid", err)
	}
}
