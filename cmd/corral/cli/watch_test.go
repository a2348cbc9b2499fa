package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

const (
	added    = watchv1.EventType_ADDED
	modified = watchv1.EventType_MODIFIED
	deleted  = watchv1.EventType_DELETED
	synced   = watchv1.EventType_SYNCED
)

func mev(t watchv1.EventType, rev int64, name string, st inventoryv1.Machine_MachineState) proto.Message {
	e := &inventoryv1.MachineEvent{Type: t, Revision: rev}
	if name != "" {
		e.Machine = &inventoryv1.Machine{Name: name, State: st}
	}
	return e
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fromRevisions returns the from_revision of every Watch request of s.
func fromRevisions(s *testServer) []int64 {
	var out []int64
	for _, m := range s.received() {
		if r, ok := m.(interface{ GetFromRevision() int64 }); ok {
			out = append(out, r.GetFromRevision())
		}
	}
	return out
}

// TestWatchMachinesResumes: a stream cut as a slow watcher
// (RESOURCE_EXHAUSTED) or lost (UNAVAILABLE) is reopened from the last
// revision seen; a compacted revision (OUT_OF_RANGE) lists again from 0,
// said on stderr; Ctrl-C ends the watch with exit 0.
func TestWatchMachinesResumes(t *testing.T) {
	s := newTestServer(t)
	s.streams["WatchMachines"] = []streamStep{
		{events: []proto.Message{
			mev(added, 5, "m1", inventoryv1.Machine_INVENTORIED),
			mev(added, 7, "machine-two", inventoryv1.Machine_DISCOVERED),
			mev(synced, 10, "", 0),
			mev(modified, 11, "m1", inventoryv1.Machine_INSTALLING),
		}, end: status.Error(codes.ResourceExhausted, "watcher too slow: last revision sent 11")},
		{events: []proto.Message{mev(deleted, 12, "machine-two", inventoryv1.Machine_DISCOVERED)},
			end: status.Error(codes.Unavailable, "appliance shutting down")},
		{end: status.Error(codes.OutOfRange, "revision 12 is compacted; re-list with from_revision 0")},
		{events: []proto.Message{
			mev(added, 13, "m1", inventoryv1.Machine_DEPLOYED),
			mev(synced, 14, "", 0),
		}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	wait := s.start(ctx, t, &stdout, &stderr, "get", "machines", "-w")
	waitFor(t, "the fourth watch", func() bool { return strings.Count(stdout.String(), "\n") >= 6 })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	want := `NAME          SERIAL   VENDOR/PRODUCT   CPUS   MEMORY   DISKS   STATE         POWER         LAST-SEEN
m1            -        -                -      -        -       INVENTORIED   UNSPECIFIED   -
machine-two   -        -                -      -        -       DISCOVERED    UNSPECIFIED   -
m1            -        -                -      -        -       INSTALLING/-  UNSPECIFIED   -
machine-two   -        -                -      -        -       DISCOVERED    UNSPECIFIED   -
m1            -        -                -      -        -       DEPLOYED      UNSPECIFIED   -
`
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{0, 11, 12, 0}, fromRevisions(s)); diff != "" {
		t.Errorf("from_revision of each watch (-want +got):\n%s", diff)
	}
	if !strings.Contains(stderr.String(), "revision 12 is no longer kept by the appliance; listing again") {
		t.Errorf("stderr does not say the watch listed again: %q", stderr.String())
	}
}

// TestWatchCutDuringList: a stream cut before SYNCED lists again from 0
// and the table shows each initial record once.
func TestWatchCutDuringList(t *testing.T) {
	s := newTestServer(t)
	s.streams["WatchMachines"] = []streamStep{
		{events: []proto.Message{mev(added, 5, "m1", inventoryv1.Machine_INVENTORIED)},
			end: status.Error(codes.ResourceExhausted, "too slow")},
		{events: []proto.Message{
			mev(added, 5, "m1", inventoryv1.Machine_INVENTORIED),
			mev(added, 6, "m2", inventoryv1.Machine_INVENTORIED),
			mev(synced, 9, "", 0),
		}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	wait := s.start(ctx, t, &stdout, &stderr, "get", "machines", "-w", "-o", "name")
	waitFor(t, "two names", func() bool { return strings.Count(stdout.String(), "\n") >= 3 })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	// -o name prints as events arrive (no table to align): the cut list's
	// m1 and the second list's.
	if diff := cmp.Diff("machine/m1\nmachine/m1\nmachine/m2\n", stdout.String()); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{0, 0}, fromRevisions(s)); diff != "" {
		t.Errorf("from_revision (-want +got):\n%s", diff)
	}
}

func TestWatchTableCutDuringList(t *testing.T) {
	s := newTestServer(t)
	s.streams["WatchNodes"] = []streamStep{
		{events: []proto.Message{&poolv1.NodeEvent{Type: added, Revision: 5, Node: &poolv1.Node{Name: "n1"}}},
			end: status.Error(codes.ResourceExhausted, "too slow")},
		{events: []proto.Message{
			&poolv1.NodeEvent{Type: added, Revision: 5, Node: &poolv1.Node{Name: "n1"}},
			&poolv1.NodeEvent{Type: synced, Revision: 9},
		}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	wait := s.start(ctx, t, &stdout, &stderr, "get", "nodes", "-w")
	waitFor(t, "the table", func() bool { return strings.Count(stdout.String(), "\n") >= 2 })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if n := strings.Count(stdout.String(), "\nn1 "); n != 1 {
		t.Errorf("n1 printed %d times:\n%s", n, stdout.String())
	}
}

// TestWatchKinds: every watchable kind, in table and JSON lines.
func TestWatchKinds(t *testing.T) {
	ts := timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	tests := map[string]struct {
		method string
		args   []string
		events []proto.Message
		want   string
	}{
		"nodes": {
			method: "WatchNodes", args: []string{"get", "nodes", "-w", "-o", "name"},
			events: []proto.Message{
				&poolv1.NodeEvent{Type: added, Revision: 1, Node: &poolv1.Node{Name: "n1"}},
				&poolv1.NodeEvent{Type: synced, Revision: 1},
				&poolv1.NodeEvent{Type: deleted, Revision: 2, Node: &poolv1.Node{Name: "n1"}},
			},
			want: "node/n1\nnode/n1\n",
		},
		"networks json": {
			method: "WatchNetworks", args: []string{"get", "net", "-w", "-o", "json"},
			events: []proto.Message{
				&poolv1.NetworkEvent{Type: synced, Revision: 3},
				&poolv1.NetworkEvent{Type: added, Revision: 4, Network: &poolv1.Network{Name: "lan", VlanId: 7}},
			},
			want: `{"type":"SYNCED","revision":"3"}` + "\n" +
				`{"type":"ADDED","revision":"4","network":{"name":"lan","vlan_id":7}}` + "\n",
		},
		"vms table": {
			method: "WatchVirtualMachines", args: []string{"get", "vm", "vm1", "-w"},
			events: []proto.Message{
				&provisioningv1.VirtualMachineEvent{Type: added, Revision: 1, VirtualMachine: &provisioningv1.VirtualMachine{Name: "vm1", ComputeNodeName: "n1", LimitCpuMilliCore: 1000, State: provisioningv1.VirtualMachine_PENDING}},
				&provisioningv1.VirtualMachineEvent{Type: synced, Revision: 1},
				&provisioningv1.VirtualMachineEvent{Type: modified, Revision: 2, VirtualMachine: &provisioningv1.VirtualMachine{Name: "vm1", ComputeNodeName: "n1", LimitCpuMilliCore: 1000, State: provisioningv1.VirtualMachine_RUNNING}},
			},
			want: `NAME   STATE     NODE   CPU       MEMORY   DISKS   ADDRESSES
vm1    PENDING   n1     0/1000m   0B       -       -
vm1    RUNNING   n1     0/1000m   0B       -       -
`,
		},
		"volumes yaml": {
			method: "WatchBlockStorages", args: []string{"get", "bs", "-w", "-o", "yaml"},
			events: []proto.Message{
				&provisioningv1.BlockStorageEvent{Type: added, Revision: 1, BlockStorage: &provisioningv1.BlockStorage{Name: "d1", NodeName: "n1"}},
			},
			want: "---\nblock_storage:\n  name: d1\n  node_name: n1\nrevision: \"1\"\ntype: ADDED\n",
		},
		"timeline follow": {
			method: "WatchTimeline", args: []string{"machine", "timeline", "m1", "-f", "--limit", "5"},
			events: []proto.Message{
				&inventoryv1.TimelineEvent{Type: added, Revision: 1, Entry: &inventoryv1.TimelineEntry{At: ts, Mac: "aa:bb:cc:dd:ee:01", Source: "dhcp", Event: "offer"}},
				&inventoryv1.TimelineEvent{Type: synced, Revision: 1},
				&inventoryv1.TimelineEvent{Type: added, Revision: 2, Entry: &inventoryv1.TimelineEntry{At: ts, Mac: "aa:bb:cc:dd:ee:01", Source: "http", Event: "script", Detail: "discover"}},
			},
			want: `TIME                       MAC                 SOURCE   EVENT   DETAIL
2025-03-01T12:00:00.000Z   aa:bb:cc:dd:ee:01   dhcp     offer
2025-03-01T12:00:00.000Z   aa:bb:cc:dd:ee:01   http     script  discover
`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			s.streams[tt.method] = []streamStep{{events: tt.events}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stdout, stderr syncbuf.Buffer
			wait := s.start(ctx, t, &stdout, &stderr, tt.args...)
			waitFor(t, "the output", func() bool { return len(stdout.String()) >= len(tt.want) })
			cancel()
			if code := wait(); code != ExitOK {
				t.Fatalf("exit %d, stderr %q", code, stderr.String())
			}
			got := stdout.String()
			if strings.HasSuffix(tt.args[len(tt.args)-1], "json") {
				// protojson's spacing varies: compare line by line as JSON.
				gl, wl := strings.Split(got, "\n"), strings.Split(tt.want, "\n")
				if len(gl) != len(wl) {
					t.Fatalf("got %d lines, want %d:\n%s", len(gl), len(wl), got)
				}
				for i := range wl {
					if wl[i] == "" {
						continue
					}
					var g, w any
					if err := json.Unmarshal([]byte(gl[i]), &g); err != nil {
						t.Fatalf("line %d: %v: %s", i, err, gl[i])
					}
					_ = json.Unmarshal([]byte(wl[i]), &w)
					if diff := cmp.Diff(w, g); diff != "" {
						t.Errorf("line %d (-want +got):\n%s", i, diff)
					}
				}
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("stdout (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWatchErrors(t *testing.T) {
	tests := map[string]struct {
		args   []string
		steps  []streamStep
		code   int
		stderr string
	}{
		"unreachable before any event": {
			args:  []string{"get", "machines", "-w"},
			steps: []streamStep{{end: status.Error(codes.Unavailable, "connection refused")}},
			code:  ExitError, stderr: "connection refused (Unavailable)",
		},
		"permission": {
			args:  []string{"get", "machines", "-w"},
			steps: []streamStep{{end: status.Error(codes.PermissionDenied, "viewer role required")}},
			code:  ExitError, stderr: `watch machines: viewer role required (PermissionDenied)`,
		},
		"images are not watchable": {args: []string{"get", "images", "-w"}, code: ExitUsage, stderr: "cannot be watched"},
		"selectors are not watchable": {
			args: []string{"get", "machines", "-w", "-l", "cpu.threads>=2"}, code: ExitUsage, stderr: "--watch filters machines by --state only",
		},
		"bad format": {args: []string{"get", "machines", "-w", "-o", "xml"}, code: ExitUsage, stderr: "unknown output format"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			s.streams["WatchMachines"] = tt.steps
			r := s.run(t, "", nil, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("exit %d %q, want %d and %q", r.code, r.stderr, tt.code, tt.stderr)
			}
		})
	}
}

func TestWatchMachineState(t *testing.T) {
	s := newTestServer(t)
	s.streams["WatchMachines"] = []streamStep{{events: []proto.Message{mev(synced, 1, "", 0)}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	wait := s.start(ctx, t, &stdout, &stderr, "get", "machines", "--state", "failed", "-w")
	waitFor(t, "the header", func() bool { return strings.Contains(stdout.String(), "NAME") })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("exit %d %q", code, stderr.String())
	}
	// A table asks for the SUMMARY view; JSON prints whole records.
	want := []proto.Message{&inventoryv1.WatchMachinesRequest{State: inventoryv1.Machine_FAILED, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}}
	if diff := cmp.Diff(want, s.received(), protocmp.Transform()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	before := len(s.received())
	wait = s.start(ctx, t, &stdout, &stderr, "get", "machines", "-w", "-o", "json")
	waitFor(t, "the second request", func() bool { return len(s.received()) > before })
	cancel()
	if code := wait(); code != ExitOK {
		t.Fatalf("-o json: exit %d %q", code, stderr.String())
	}
	want = []proto.Message{&inventoryv1.WatchMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_FULL}}
	if diff := cmp.Diff(want, s.received()[before:], protocmp.Transform()); diff != "" {
		t.Errorf("-o json requests (-want +got):\n%s", diff)
	}
}
