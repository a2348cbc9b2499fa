package cli

import (
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestMachineAllocationVerbs(t *testing.T) {
	for name, tc := range map[string]struct {
		args   []string
		code   int
		req    proto.Message
		stdout string
		stderr string
	}{
		"accept to pool": {args: []string{"machine", "accept", "m1", "--target", "pool"},
			req: &inventoryv1.AcceptMachineRequest{Name: "m1", Disk: "auto", Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}},
		"accept bad target": {args: []string{"machine", "accept", "m1", "--target", "os"}, code: ExitUsage, stderr: "want hypervisor or pool"},
		"allocate": {args: []string{"machine", "allocate", "--selector", "pool=ci,cpu.cores>=16", "--count", "2", "--expires", "8h"},
			req:    &inventoryv1.AllocateMachinesRequest{Selector: "pool=ci,cpu.cores>=16", Count: 2, ExpiresIn: durationpb.New(8 * time.Hour)},
			stdout: "machine m1: ALLOCATED to token:ab12 (ci)\nmachine m2: ALLOCATED"},
		"allocate days": {args: []string{"machine", "allocate", "--pool", "ci", "--expires", "7d"},
			req: &inventoryv1.AllocateMachinesRequest{Pool: "ci", Count: 1, ExpiresIn: durationpb.New(7 * 24 * time.Hour)}},
		"allocate bad expiry":  {args: []string{"machine", "allocate", "--expires", "-1h"}, code: ExitUsage, stderr: "want a positive duration"},
		"allocate bad expiry2": {args: []string{"machine", "allocate", "--expires", "soon"}, code: ExitUsage, stderr: "want a positive duration"},
		"release": {args: []string{"machine", "release", "m1", "--reason", "done"},
			req: &inventoryv1.ReleaseMachineRequest{Name: "m1", Reason: "done"}, stdout: "machine m1: READY (released by its owner)"},
		"release erase full": {args: []string{"machine", "release", "m1", "--erase", "full"},
			req: &inventoryv1.ReleaseMachineRequest{Name: "m1", Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL}},
		"release erase none": {args: []string{"machine", "release", "m1", "--erase", "none"},
			req: &inventoryv1.ReleaseMachineRequest{Name: "m1", Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE}},
		"release bad erase": {args: []string{"machine", "release", "m1", "--erase", "shred"}, code: ExitUsage, stderr: "want quick, full, secure or none"},
		"label": {args: []string{"label", "machine", "m1", "zone=a", "pool=ci", "rack-"},
			req: &inventoryv1.LabelMachineRequest{Name: "m1", Set: map[string]string{"zone": "a", "pool": "ci"}, Remove: []string{"rack"}}, stdout: "machine m1: READY"},
		"label empty value": {args: []string{"label", "machine", "m1", "team="},
			req: &inventoryv1.LabelMachineRequest{Name: "m1", Set: map[string]string{"team": ""}}},
		"label nothing":  {args: []string{"label", "machine", "m1"}, code: ExitUsage, stderr: "wrong number of arguments"},
		"label bad arg":  {args: []string{"label", "machine", "m1", "rack"}, code: ExitUsage, stderr: "want KEY=VALUE to set or KEY- to remove"},
		"label twice":    {args: []string{"label", "machine", "m1", "a=1", "a=2"}, code: ExitUsage, stderr: "given twice"},
		"label not kind": {args: []string{"label", "node", "n1", "a=1"}, code: ExitUsage, stderr: "machines only"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			if tc.req == nil {
				return
			}
			got := s.received()
			if len(got) != 1 {
				t.Fatalf("requests %v", got)
			}
			if d := cmp.Diff(tc.req, got[0], protocmp.Transform()); d != "" {
				t.Fatalf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestEraseNote(t *testing.T) {
	at := timestamppb.New(time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC))
	disks := []string{"/dev/vda", "/dev/vdb"}
	full := inventoryv1.EraseLevel_ERASE_LEVEL_FULL
	for name, tc := range map[string]struct {
		e    *inventoryv1.Erase
		want string
	}{
		"none":    {},
		"waiting": {e: &inventoryv1.Erase{EraseId: "erase-1", Level: full, Disks: disks, RequestedAt: at}, want: "full of /dev/vda, /dev/vdb: waiting for the discovery agent since 2026-11-28T10:00:00Z"},
		"sent":    {e: &inventoryv1.Erase{EraseId: "erase-1", Level: full, Disks: disks, SentAt: at}, want: "full of /dev/vda, /dev/vdb: sent to the discovery agent at 2026-11-28T10:00:00Z"},
		"step": {e: &inventoryv1.Erase{EraseId: "erase-1", Level: full, Disks: disks, Step: "erase", Detail: "/dev/vda: zeroing (1 of 10 GiB)", UpdatedAt: at},
			want: "full of /dev/vda, /dev/vdb: erase (/dev/vda: zeroing (1 of 10 GiB)) at 2026-11-28T10:00:00Z"},
		"erased": {e: &inventoryv1.Erase{EraseId: "erase-1", Level: full, Disks: disks, FinishedAt: at}, want: "full of /dev/vda, /dev/vdb: erased at 2026-11-28T10:00:00Z"},
		"failed": {e: &inventoryv1.Erase{EraseId: "erase-1", Level: inventoryv1.EraseLevel_ERASE_LEVEL_SECURE, Disks: disks, FinishedAt: at, Error: "/dev/vda: not supported"},
			want: "secure of /dev/vda, /dev/vdb: failed at 2026-11-28T10:00:00Z: /dev/vda: not supported"},
	} {
		if got := eraseNote(&inventoryv1.Machine{Erase: tc.e}); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}
