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

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/deploy"
)

// multiDoc is an n0stack-style file with every appliable kind.
const multiDoc = `# the lab pool
kind: node
name: n1
address: 10.0.0.11
cpu_milli_cores: 16000
memory_bytes: 68719476736
storage_bytes: 1TiB
rack: r1
annotations:
  corral/owner: lab
---
kind: network
name: lan
ipv4_cidr: 192.168.0.0/24
ipv6_cidr: fd00::/64
ipv4_gateway: 192.168.0.1
dns_servers: [192.168.0.1, 1.1.1.1]
vlan_id: 100
labels:
  env: test
--- # comments after the separator are fine
---
kind: image
name: debian
---
kind: bs
name: debian-12
request_bytes: 10GiB
limit_bytes: 21474836480
source_url: https://example.test/debian-12.qcow2
source_sha256: abc123
---
kind: block_storage
name: scratch
request_bytes: 1G
limit_bytes: "2000000000"
---
kind: VirtualMachine
name: vm1
annotations:
  n0core/provisioning/virtual_machine/vnc_websocket_url: ""
request_cpu_milli_core: 1500
limit_cpu_milli_core: 2000
request_memory_bytes: 2GiB
limit_memory_bytes: 2147483648
block_storage_names: [debian-12, scratch]
nics:
  - network_name: lan
    ipv4_address: 192.168.0.10
ssh_authorized_keys:
  - ssh-ed25519 AAAA user@host
`

func multiDocRequests() []proto.Message {
	return []proto.Message{
		&poolv1.ApplyNodeRequest{
			Name: "n1", Address: "10.0.0.11", CpuMilliCores: 16000,
			MemoryBytes: 64 << 30, StorageBytes: 1 << 40, Rack: "r1",
			Annotations: map[string]string{"corral/owner": "lab"},
		},
		&poolv1.ApplyNetworkRequest{
			Name: "lan", Ipv4Cidr: "192.168.0.0/24", Ipv6Cidr: "fd00::/64", Ipv4Gateway: "192.168.0.1",
			DnsServers: []string{"192.168.0.1", "1.1.1.1"}, VlanId: 100,
			Labels: map[string]string{"env": "test"},
		},
		&deploymentv1.ApplyImageRequest{Name: "debian"},
		&provisioningv1.FetchBlockStorageRequest{
			Name: "debian-12", RequestBytes: 10 << 30, LimitBytes: 20 << 30,
			SourceUrl: "https://example.test/debian-12.qcow2", SourceSha256: "abc123",
		},
		&provisioningv1.CreateBlockStorageRequest{Name: "scratch", RequestBytes: 1e9, LimitBytes: 2e9},
		&provisioningv1.CreateVirtualMachineRequest{
			Name:                "vm1",
			Annotations:         map[string]string{"n0core/provisioning/virtual_machine/vnc_websocket_url": ""},
			RequestCpuMilliCore: 1500, LimitCpuMilliCore: 2000,
			RequestMemoryBytes: 2 << 30, LimitMemoryBytes: 2 << 30,
			BlockStorageNames: []string{"debian-12", "scratch"},
			Nics:              []*provisioningv1.VirtualMachineNIC{{NetworkName: "lan", Ipv4Address: "192.168.0.10"}},
			SshAuthorizedKeys: []string{"ssh-ed25519 AAAA user@host"},
		},
	}
}

const multiDocOutput = `node/n1 applied
network/lan applied
image/debian applied
block_storage/debian-12 applied
block_storage/scratch applied
virtual_machine/vm1 applied
`

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestApply(t *testing.T) {
	tests := map[string]struct {
		stdin bool
	}{
		"file":  {stdin: false},
		"stdin": {stdin: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			var r result
			if tt.stdin {
				r = s.run(t, multiDoc, nil, "apply", "-f", "-")
			} else {
				r = s.run(t, "", nil, "apply", "-f", writeFile(t, multiDoc))
			}
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if diff := cmp.Diff(multiDocOutput, r.stdout); diff != "" {
				t.Errorf("stdout (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(multiDocRequests(), s.received(), protocmp.Transform()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

// TestApplyRejects checks that a file with any bad document is refused
// as a whole: exit 2, one line naming the problem, and no request sent.
func TestApplyRejects(t *testing.T) {
	valid := "kind: node\nname: n1\n---\nkind: network\nname: lan\nipv4_cidr: 10.0.0.0/24\n---\n"
	tests := map[string]struct {
		body string
		want []string // substrings of the error line
	}{
		"unknown field": {
			body: valid + "kind: network\nname: wan\nipv4_cdir: 10.1.0.0/24\n",
			want: []string{"document 3 (line 8)", `unknown field "ipv4_cdir"`, `network "wan" (ApplyNetworkRequest)`},
		},
		"unknown nested field": {
			body: valid + "kind: vm\nname: vm1\nnics:\n  - network_name: lan\n  - network: wan\n",
			want: []string{"document 3", `unknown field "nics[1].network"`},
		},
		"field of the other block storage request": {
			body: "kind: bs\nname: d1\nsource_sha256: abc\n",
			want: []string{"document 1", `unknown field "source_sha256"`, "CreateBlockStorageRequest"},
		},
		"unknown kind": {
			body: valid + "kind: pod\nname: p1\n",
			want: []string{"document 3", `unknown kind "pod"`, "node, network"},
		},
		"kind that cannot be applied": {
			body: "kind: machine\nname: m1\n",
			want: []string{"document 1", "kind machine cannot be applied"},
		},
		"missing kind": {
			body: valid + "name: x\n",
			want: []string{"document 3", "missing kind"},
		},
		"missing name": {
			body: "kind: image\nlabels: {a: b}\n",
			want: []string{"document 1", "name is required"},
		},
		"wrong type": {
			body: valid + "kind: network\nname: wan\nvlan_id: many\n",
			want: []string{"document 3", `network "wan" (ApplyNetworkRequest): field "vlan_id": want a number, got the string "many"`},
		},
		"bad size": {
			body: "kind: bs\nname: d1\nrequest_bytes: 10XB\n",
			want: []string{"document 1", `field "request_bytes"`, `unknown unit "XB"`},
		},
		"duplicate key": {
			body: "kind: node\nname: n1\nname: n2\n",
			want: []string{"document 1", "invalid YAML"},
		},
		"not a mapping": {
			body: valid + "- kind: node\n",
			want: []string{"document 3", "not a mapping"},
		},
		"only comments": {
			body: "# nothing\n---\n",
			want: []string{"no documents"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			path := writeFile(t, tt.body)
			r := s.run(t, "", nil, "apply", "-f", path)
			if r.code != ExitUsage {
				t.Errorf("exit %d, want %d", r.code, ExitUsage)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "corral: ") {
				t.Errorf("stderr %q is not one corral: line", r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if got := s.received(); len(got) != 0 {
				t.Errorf("sent %d requests, want none: %v", len(got), got)
			}
		})
	}
}

func TestApplyStopsAtFirstAPIError(t *testing.T) {
	s := newTestServer(t)
	s.fail["ApplyNetwork"] = status.Error(codes.InvalidArgument, `ipv4_cidr "10.0.0.0/33" is not a CIDR`)
	body := "kind: node\nname: n1\n---\nkind: network\nname: lan\nipv4_cidr: 10.0.0.0/33\n---\nkind: image\nname: debian\n"
	r := s.run(t, "", nil, "apply", "-f", writeFile(t, body))
	if r.code != ExitError {
		t.Errorf("exit %d, want %d", r.code, ExitError)
	}
	if r.stdout != "node/n1 applied\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	want := `: document 2 (line 4): network "lan": ipv4_cidr "10.0.0.0/33" is not a CIDR (InvalidArgument)` + "\n"
	if !strings.HasPrefix(r.stderr, "corral: ") || !strings.HasSuffix(r.stderr, want) {
		t.Errorf("stderr %q, want corral: <file>%s", r.stderr, want)
	}
	if got := len(s.received()); got != 2 {
		t.Errorf("sent %d requests, want 2 (the image must not be applied)", got)
	}
}

func TestApplyUsage(t *testing.T) {
	tests := map[string]struct {
		args []string
		code int
		want string
	}{
		"no file":      {args: []string{"apply"}, code: ExitUsage, want: "needs -f"},
		"extra arg":    {args: []string{"apply", "-f", "-", "x.yaml"}, code: ExitUsage, want: "wrong number of arguments"},
		"stdin twice":  {args: []string{"apply", "-f", "-", "-f", "-"}, code: ExitUsage, want: "more than once"},
		"missing file": {args: []string{"apply", "-f", "/nonexistent/pool.yaml"}, code: ExitUsage, want: "/nonexistent/pool.yaml"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "kind: image\nname: x\n", nil, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", r.code, r.stderr, tt.code, tt.want)
			}
			if got := s.received(); len(got) != 0 {
				t.Errorf("sent %v, want nothing", got)
			}
		})
	}
}

func TestSplitDocuments(t *testing.T) {
	tests := map[string]struct {
		in   string
		want []rawDoc
	}{
		"single":           {in: "a: 1\n", want: []rawDoc{{1, []byte("a: 1\n")}}},
		"leading marker":   {in: "---\na: 1\n", want: []rawDoc{{1, nil}, {2, []byte("a: 1\n")}}},
		"no final newline": {in: "a: 1\n---\nb: 2", want: []rawDoc{{1, []byte("a: 1\n")}, {3, []byte("b: 2")}}},
		"marker in value":  {in: "a: |\n  ---x\n", want: []rawDoc{{1, []byte("a: |\n  ---x\n")}}},
		"marker with text": {in: "---x: 1\n", want: []rawDoc{{1, []byte("---x: 1\n")}}},
		"crlf":             {in: "a: 1\r\n---\r\nb: 2\r\n", want: []rawDoc{{1, []byte("a: 1\r\n")}, {3, []byte("b: 2\r\n")}}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := splitDocuments([]byte(tt.in))
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(rawDoc{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzDecodeDocuments checks that no input makes decoding panic and that
// every accepted document names a kind that can be applied.
func FuzzDecodeDocuments(f *testing.F) {
	f.Add([]byte(multiDoc))
	f.Add([]byte("kind: vm\nname: a\nnics: [{network_name: x, annotations: {a: b}}]\n"))
	f.Add([]byte("---\n---\nkind: [\n"))
	f.Add([]byte("kind: node\nname: n\nmemory_bytes: 1.5GiB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := decodeDocuments(deploy.DefaultRegistry(), "fuzz", data)
		if err != nil {
			return
		}
		for _, d := range docs {
			if d.Document == nil || d.Kind.Apply == "" || d.Method == nil || d.name == "" || d.Request == nil {
				t.Fatalf("accepted incomplete document %+v", d)
			}
		}
	})
}
