package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

func auditEvent(id string, at time.Time, machine, method, code string) *auditv1.AuditEvent {
	obj, action := "", ""
	if machine != "" {
		obj, action = "machine/"+machine, "power on"
	}
	return &auditv1.AuditEvent{
		Id: id, At: timestamppb.New(at), Who: "token:t1 (ops)", TokenId: "t1", Role: authv1.Role_ROLE_OPERATOR,
		Method: method, Object: obj, Machine: machine, Code: code, DurationMs: 12, Peer: "10.0.0.5:4000", Action: action,
	}
}

func seedEvents(s *testServer, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = []*auditv1.AuditEvent{
		auditEvent("e1", now.Add(-3*time.Hour), "m1", "/corral.inventory.v1.MachineService/AcceptMachine", "OK"),
		auditEvent("e2", now.Add(-30*time.Minute), "m2", "/corral.inventory.v1.MachineService/SetPower", "PermissionDenied"),
		auditEvent("e3", now.Add(-10*time.Minute), "m1", "/corral.inventory.v1.MachineService/SetPower", "OK"),
	}
}

func TestGetEvents(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		args    []string
		code    int
		want    string
		wantReq *auditv1.ListEventsRequest
		stderr  string
	}{
		"table": {
			args: []string{"get", "events"},
			want: `WHEN                   WHO              METHOD                         OBJECT       CODE
2025-03-01T09:00:00Z   token:t1 (ops)   MachineService/AcceptMachine   machine/m1   OK
2025-03-01T11:30:00Z   token:t1 (ops)   MachineService/SetPower        machine/m2   PermissionDenied
2025-03-01T11:50:00Z   token:t1 (ops)   MachineService/SetPower        machine/m1   OK
`,
			wantReq: &auditv1.ListEventsRequest{},
		},
		"machine and since": {
			args: []string{"get", "events", "--machine", "m1", "--since", "2025-03-01T10:00:00Z", "-o", "name"},
			want: "event/e3\n",
			wantReq: &auditv1.ListEventsRequest{Machine: "m1",
				Since: timestamppb.New(time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC))},
		},
		"wide": {
			args: []string{"get", "event", "--machine", "m2", "-o", "wide"},
			want: `WHEN                   WHO              METHOD                    OBJECT       CODE               MACHINE   ACTION     ROLE       PEER           APPLIANCE   DURATION   MESSAGE
2025-03-01T11:30:00Z   token:t1 (ops)   MachineService/SetPower   machine/m2   PermissionDenied   m2        power on   OPERATOR   10.0.0.5:4000  -           12ms       -
`,
			wantReq: &auditv1.ListEventsRequest{Machine: "m2"},
		},
		"bad since":       {args: []string{"get", "events", "--since", "yesterday"}, code: ExitUsage, stderr: `--since "yesterday": want an age`},
		"since on nodes":  {args: []string{"get", "nodes", "--since", "1h"}, code: ExitUsage, stderr: "--since and --machine filter the events only"},
		"a name":          {args: []string{"get", "events", "e1"}, code: ExitUsage, stderr: "takes no NAME"},
		"machine filters": {args: []string{"get", "events", "--state", "failed"}, code: ExitUsage, stderr: "filter the machine list only"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seedEvents(s, now)
			r := s.run(t, "", nil, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Fatalf("exit %d, stderr %q; want %d, %q", r.code, r.stderr, tt.code, tt.stderr)
			}
			if tt.code != ExitOK {
				return
			}
			gl, wl := strings.Split(r.stdout, "\n"), strings.Split(tt.want, "\n")
			if len(gl) != len(wl) {
				t.Fatalf("got:\n%s\nwant:\n%s", r.stdout, tt.want)
			}
			for i := range wl {
				if diff := cmp.Diff(strings.Fields(wl[i]), strings.Fields(gl[i])); diff != "" {
					t.Errorf("line %d (-want +got):\n%s", i, diff)
				}
			}
			if diff := cmp.Diff([]proto.Message{tt.wantReq}, s.received(), protocmp.Transform()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"1h":                   now.Add(-time.Hour),
		"90m":                  now.Add(-90 * time.Minute),
		"2d":                   now.Add(-48 * time.Hour),
		"2025-02-28T00:00:00Z": time.Date(2025, 2, 28, 0, 0, 0, 0, time.UTC),
	} {
		got, err := parseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1h", "soon", "1y"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q) accepted", bad)
		}
	}
}

// TestWatchEvents: the list, then the stream's events not already
// printed, filtered by --machine.
func TestWatchEvents(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	s := newTestServer(t)
	seedEvents(s, now)
	ev := func(typ int, e *auditv1.AuditEvent, rev int64) proto.Message {
		return &auditv1.AuditStreamEvent{Type: []watchv1.EventType{added, synced}[typ], Revision: rev, Event: e}
	}
	s.streams["WatchEvents"] = []streamStep{{events: []proto.Message{
		ev(0, s.events[0], 1), // already listed
		ev(0, s.events[2], 3), // already listed
		ev(1, nil, 3),
		ev(0, auditEvent("e4", now, "m2", "/corral.inventory.v1.MachineService/SetPower", "OK"), 4), // another machine
		ev(0, auditEvent("e5", now, "m1", "/corral.inventory.v1.MachineService/DeleteMachine", "OK"), 5),
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	wait := s.start(ctx, t, &stdout, &stderr, "get", "events", "--machine", "m1", "-w", "-o", "name")
	waitFor(t, "e5", func() bool { return strings.Contains(stdout.String(), "event/e5") })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("exit %d %q", code, stderr.String())
	}
	if diff := cmp.Diff("event/e1\nevent/e3\nevent/e5\n", stdout.String()); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
}
