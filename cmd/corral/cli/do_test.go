package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

const doFile = `ApplyNode:
  type: Node
  action: ApplyNode
  args: {name: n1, cpu_milli_cores: 4000}
ApplyNetwork:
  type: Network
  action: ApplyNetwork
  args: {name: lan, ipv4_cidr: 10.0.0.0/24}
  depends_on: [ApplyNode]
Disk:
  type: BlockStorage
  action: CreateBlockStorage
  args: {name: d1, request_bytes: 1024, limit_bytes: 2048}
  depends_on: [ApplyNetwork]
`

func TestDo(t *testing.T) {
	s := newTestServer(t)
	res := s.run(t, doFile, nil, "do", "-", "--parallel", "1")
	if res.code != ExitOK {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	want := []proto.Message{
		&poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 4000},
		&poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/24"},
		&provisioningv1.CreateBlockStorageRequest{Name: "d1", RequestBytes: 1024, LimitBytes: 2048},
	}
	if diff := cmp.Diff(want, s.received(), protocmp.Transform()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	wantPrefixes := []string{
		"[0/3] ApplyNode started (Node ApplyNode)",
		"[1/3] ApplyNode done in ",
		`    {"name":"n1"}`,
		"[1/3] ApplyNetwork started (Network ApplyNetwork)",
		"[2/3] ApplyNetwork done in ",
		`    {"name":"lan"`,
		"[2/3] Disk started (BlockStorage CreateBlockStorage)",
		"[3/3] Disk done in ",
		`    {"name":"d1"`,
		"3 succeeded, 0 failed, 0 ignored failures, 0 skipped of 3 tasks in ",
	}
	if len(lines) != len(wantPrefixes) {
		t.Fatalf("stdout:\n%s", res.stdout)
	}
	for i, p := range wantPrefixes {
		if !strings.HasPrefix(lines[i], p) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], p)
		}
	}
}

func TestDoFailure(t *testing.T) {
	s := newTestServer(t)
	s.fail["ApplyNetwork"] = status.Error(codes.InvalidArgument, "ipv4_cidr overlaps network wan")
	file := filepath.Join(t.TempDir(), "dag.yaml")
	if err := os.WriteFile(file, []byte(doFile), 0o600); err != nil {
		t.Fatal(err)
	}
	res := s.run(t, "", nil, "do", file, "-q")
	if res.code != ExitError {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	for _, want := range []string{
		"[2/3] ApplyNetwork failed after ",
		": ipv4_cidr overlaps network wan (InvalidArgument)\n",
		`[3/3] Disk skipped: dependency "ApplyNetwork" failed`,
		"1 succeeded, 1 failed, 0 ignored failures, 1 skipped of 3 tasks",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, res.stdout)
		}
	}
	if strings.Contains(res.stdout, `{"name"`) {
		t.Errorf("-q printed responses:\n%s", res.stdout)
	}
	if want := "corral: " + file + `: task failed: "ApplyNetwork"` + "\n"; res.stderr != want {
		t.Errorf("stderr %q, want %q", res.stderr, want)
	}
	if n := len(s.received()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestDoBadInput(t *testing.T) {
	tests := map[string]struct {
		stdin  string
		args   []string
		stderr string
	}{
		"cycle": {
			stdin:  "a: {type: Node, action: GetNode, depends_on: [b]}\nb: {type: Node, action: GetNode, depends_on: [a]}\n",
			stderr: `corral: stdin: dependency cycle: "a" -> "b" -> "a" (each task depends on the next); nothing was run` + "\n",
		},
		"several problems": {
			stdin: "a: {type: Nod, action: GetNode}\nb: {type: Node, action: GetNode, depends_on: [c]}\n",
			stderr: `stdin: task "a" (line 1): unknown type "Nod" (valid: Agent, Appliance, Audit, Backup, BlockStorage, BmcCredential, BmcRedfish, Commission, Console, Hypervisor, Image, Machine, Network, Node, OSImage, StandbyPool, Token, VirtualMachine, Webhook)
stdin: task "b" (line 2): depends_on "c": no such task
corral: stdin: 2 problems (listed above); nothing was run
`,
		},
		"parallel": {
			stdin:  doFile,
			args:   []string{"--parallel", "0"},
			stderr: "corral: --parallel must be at least 1, got 0\n",
		},
		"task timeout": {
			stdin:  doFile,
			args:   []string{"--task-timeout", "0s"},
			stderr: "corral: --task-timeout must be positive, got 0s\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			res := s.run(t, tc.stdin, nil, append([]string{"do", "-"}, tc.args...)...)
			if res.code != ExitUsage {
				t.Errorf("exit %d", res.code)
			}
			if res.stderr != tc.stderr {
				t.Errorf("stderr:\n%s\nwant:\n%s", res.stderr, tc.stderr)
			}
			if n := len(s.received()); n != 0 || len(s.dialed) != 0 {
				t.Errorf("%d requests, %d dials on bad input", n, len(s.dialed))
			}
		})
	}
	s := newTestServer(t)
	if res := s.run(t, "", nil, "do"); res.code != ExitUsage || !strings.Contains(res.stderr, "wrong number of arguments: usage: corral do FILE") {
		t.Errorf("no file: exit %d stderr %q", res.code, res.stderr)
	}
}
