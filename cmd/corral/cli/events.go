package cli

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
)

// eventNames are the names get accepts for the audit stream.
var eventNames = []string{"events", "event", "ev", "audit"}

func isEventsKind(name string) bool {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, e := range eventNames {
		if n == e {
			return true
		}
	}
	return false
}

// eventFilter holds the `get events` filters.
type eventFilter struct {
	since   string
	machine string
}

func (f *eventFilter) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.since, "since", "", "events: only those at or after this age (1h, 30m, 2d) or RFC 3339 time (default: the appliance's, the last 24h)")
	fs.StringVar(&f.machine, "machine", "", "events: only those concerning this machine")
}

func (f *eventFilter) set() bool { return f.since != "" || f.machine != "" }

// parseSince reads --since: a duration before now (Go syntax, plus a
// whole number of days "2d") or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(d); err == nil && n >= 0 && n <= 36500 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, usageErrorf("--since %q: want an age such as 1h, 30m or 2d, or an RFC 3339 time such as 2025-03-01T12:00:00Z", s)
	}
	return now.Add(-d), nil
}

// eventKind draws audit events like a kind's records.
var eventKind = &kind{
	name:    "event",
	columns: []string{"WHEN", "WHO", "METHOD", "OBJECT", "CODE"},
	row: func(m proto.Message) []string {
		e := m.(*auditv1.AuditEvent)
		return []string{
			e.GetAt().AsTime().UTC().Format(time.RFC3339),
			cell(e.GetWho()),
			cell(shortMethod(e.GetMethod())),
			cell(e.GetObject()),
			cell(e.GetCode()),
		}
	},
	wide: []string{"MACHINE", "ACTION", "ROLE", "PEER", "APPLIANCE", "DURATION", "MESSAGE"},
	wideRow: func(m proto.Message) []string {
		e := m.(*auditv1.AuditEvent)
		return []string{
			cell(e.GetMachine()),
			cell(e.GetAction()),
			stateName(e.GetRole().String(), "ROLE_"),
			cell(e.GetPeer()),
			cell(e.GetAppliance()),
			(time.Duration(e.GetDurationMs()) * time.Millisecond).String(),
			cell(e.GetMessage()),
		}
	},
}

// shortMethod drops the package of a full gRPC method:
// /corral.inventory.v1.MachineService/SetPower → MachineService/SetPower.
func shortMethod(m string) string {
	m = strings.TrimPrefix(m, "/")
	svc, method, ok := strings.Cut(m, "/")
	if !ok {
		return m
	}
	if i := strings.LastIndexByte(svc, '.'); i >= 0 {
		svc = svc[i+1:]
	}
	return svc + "/" + method
}

// maxSeenEvents bounds the event ids a watch remembers to print each event
// once when the list and the stream overlap.
const maxSeenEvents = 10000

// seenIDs is a bounded set of ids, forgetting the oldest first.
type seenIDs struct {
	set  map[string]bool
	fifo []string
}

func (s *seenIDs) add(id string) bool {
	if s.set == nil {
		s.set = map[string]bool{}
	}
	if s.set[id] {
		return false
	}
	if len(s.fifo) >= maxSeenEvents {
		delete(s.set, s.fifo[0])
		s.fifo = s.fifo[1:]
	}
	s.set[id] = true
	s.fifo = append(s.fifo, id)
	return true
}

// getEvents runs `get events`: ListEvents with the filters, and with -w
// then WatchEvents, printing each event once (the stream's initial events
// overlap the list) when it passes the filters.
func (inv *invocation) getEvents(cmd *cobra.Command, f *eventFilter, output string, watch bool) error {
	req := &auditv1.ListEventsRequest{Machine: f.machine}
	var since time.Time
	if f.since != "" {
		t, err := parseSince(f.since, time.Now())
		if err != nil {
			return err
		}
		since = t
		req.Since = timestamppb.New(t)
	}
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	ctx, cancel := inv.callContext(cmd)
	resp, err := auditv1.NewAuditServiceClient(cc).ListEvents(ctx, req)
	cancel()
	if err != nil {
		return inv.callError("list events", err)
	}
	ms := messages(resp.GetEvents())
	if !watch {
		return printRecords(cmd.OutOrStdout(), eventKind, ms, true, output)
	}

	var seen seenIDs
	header, _ := eventKind.table(nil, output)
	p := &eventPrinter{
		w: cmd.OutOrStdout(), format: output, kindName: eventKind.name, header: header,
		row:     func(m proto.Message) []string { return eventKind.cells(m, output) },
		dedupes: true,
		keep: func(ev watchEvent) bool {
			e, ok := ev.obj.(*auditv1.AuditEvent)
			if !ok {
				return false
			}
			if f.machine != "" && e.GetMachine() != f.machine {
				return false
			}
			if !since.IsZero() && e.GetAt().AsTime().Before(since) {
				return false
			}
			return e.GetId() == "" || seen.add(e.GetId())
		},
	}
	for _, e := range resp.GetEvents() {
		ev := watchEvent{typ: watchv1.EventType_ADDED, obj: e, raw: &auditv1.AuditStreamEvent{Type: watchv1.EventType_ADDED, Event: e}}
		if err := p.event(ev); err != nil {
			return err
		}
	}
	return inv.runWatch(cmd.Context(), "watch events", func(ctx context.Context, from int64) (recvFunc, error) {
		s, err := auditv1.NewAuditServiceClient(cc).WatchEvents(ctx, &auditv1.WatchEventsRequest{FromRevision: from})
		if err != nil {
			return nil, err
		}
		return streamRecv(s, func(e *auditv1.AuditStreamEvent) proto.Message { return nonNil(e.GetEvent()) }), nil
	}, p)
}
