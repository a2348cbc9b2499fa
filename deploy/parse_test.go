package deploy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/testing/protocmp"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

func TestParseErrors(t *testing.T) {
	tests := map[string]struct {
		file string
		want []string // every problem, in order
	}{
		"bad YAML": {
			file: "a:\n  type: Node\n   action: ApplyNode\n",
			want: []string{"invalid YAML: yaml: line 3: mapping values are not allowed in this context"},
		},
		"duplicate task": {
			file: "a:\n  type: Node\n  action: GetNode\na:\n  type: Node\n  action: GetNode\n",
			want: []string{`invalid YAML: yaml: unmarshal errors:
  line 5: key "a" already set in map`},
		},
		"empty file":     {file: "# nothing\n", want: []string{"no tasks in file"}},
		"empty map":      {file: "{}\n", want: []string{"no tasks in file"}},
		"list at top":    {file: "- a\n- b\n", want: []string{"the file must be a map of task name to task {type, action, args, depends_on, ignore_error}"}},
		"task not a map": {file: "a: 3\n", want: []string{`task "a" (line 1): must be a mapping with keys type, action, args, depends_on, ignore_error`}},
		"null task":      {file: "a:\n", want: []string{`task "a" (line 1): must be a mapping with keys type, action, args, depends_on, ignore_error`}},
		"unknown task key (n0cli's misspelt help)": {
			file: "a:\n  type: Node\n  action: GetNode\n  depend_on: [b]\n",
			want: []string{`task "a" (line 1): unknown key "depend_on" (valid: type, action, args, depends_on, ignore_error) (did you mean "depends_on"?)`},
		},
		"missing type": {
			file: "a:\n  action: GetNode\n",
			want: []string{`task "a" (line 1): missing type (valid: Agent, Appliance, Audit, Backup, BlockStorage, BmcCredential, BmcRedfish, Commission, Console, Hypervisor, Image, Machine, Network, Node, OSImage, StandbyPool, Token, VirtualMachine, Webhook)`},
		},
		"unknown type": {
			file: "a:\n  type: Nodes\n  action: GetNode\n",
			want: []string{`task "a" (line 1): unknown type "Nodes" (valid: Agent, Appliance, Audit, Backup, BlockStorage, BmcCredential, BmcRedfish, Commission, Console, Hypervisor, Image, Machine, Network, Node, OSImage, StandbyPool, Token, VirtualMachine, Webhook)`},
		},
		"unknown action": {
			file: "a:\n  type: Network\n  action: CreateNetwork\n",
			want: []string{`task "a" (line 1): unknown action "CreateNetwork" for type Network (valid: ApplyNetwork, DeleteNetwork, GetNetwork, ListNetworks, ReleaseNetworkInterface, ReserveNetworkInterface)`},
		},
		"streaming action": {
			file: "a:\n  type: Agent\n  action: Session\n",
			want: []string{`task "a" (line 1): action Session of type Agent is a streaming RPC; do calls unary RPCs only (valid: AttestBegin, Join, Register)`},
		},
		"type not a string": {
			file: "a:\n  type: [Node]\n  action: GetNode\n",
			want: []string{`task "a" (line 1): type must be a string`, `task "a" (line 1): missing type (valid: Agent, Appliance, Audit, Backup, BlockStorage, BmcCredential, BmcRedfish, Commission, Console, Hypervisor, Image, Machine, Network, Node, OSImage, StandbyPool, Token, VirtualMachine, Webhook)`},
		},
		"unknown arg": {
			file: "a:\n  type: Network\n  action: ApplyNetwork\n  args:\n    name: n\n    ipv4_cidrs: 10.0.0.0/24\n",
			want: []string{`task "a" (line 1): args of Network.ApplyNetwork: unknown field "ipv4_cidrs" in ApplyNetworkRequest (valid: name, annotations, labels, ipv4_cidr, ipv6_cidr, domain, ipv4_gateway, ipv6_gateway, dns_servers, vlan_id) (did you mean "ipv4_cidr"?)`},
		},
		"unknown nested arg": {
			file: "vm:\n  type: VirtualMachine\n  action: CreateVirtualMachine\n  args:\n    name: v\n    nics:\n      - network_name: n\n      - network: n\n",
			want: []string{`task "vm" (line 1): args of VirtualMachine.CreateVirtualMachine: unknown field "nics[1].network" in VirtualMachineNIC (valid: network_name, annotations, hardware_address, ipv4_address, ipv6_address)`},
		},
		"wrong arg type": {
			file: "a:\n  type: Image\n  action: UntagImage\n  args:\n    name: i\n    tag: 18.04\n",
			want: []string{`task "a" (line 1): args of Image.UntagImage: field "tag": want a string, got the number 18.04`},
		},
		"args not a map": {
			file: "a:\n  type: Node\n  action: GetNode\n  args: [n1]\n",
			want: []string{`task "a" (line 1): args of Node.GetNode: must be a mapping of GetNodeRequest fields`},
		},
		"depends_on not a list": {
			file: "a:\n  type: Node\n  action: GetNode\n  depends_on: b\nb:\n  type: Node\n  action: GetNode\n",
			want: []string{`task "a" (line 1): depends_on must be a list of task names (quote names YAML reads as booleans or numbers, such as y, no or 1.0)`},
		},
		"depends_on with a YAML 1.1 boolean": {
			file: "a:\n  type: Node\n  action: GetNode\n  depends_on: [b, n]\nb:\n  type: Node\n  action: GetNode\n",
			want: []string{`task "a" (line 1): depends_on must be a list of task names (quote names YAML reads as booleans or numbers, such as y, no or 1.0)`},
		},
		"ignore_error not a bool": {
			file: "a:\n  type: Node\n  action: GetNode\n  ignore_error: maybe\n",
			want: []string{`task "a" (line 1): ignore_error must be true or false`},
		},
		"missing dependency": {
			file: "a:\n  type: Node\n  action: GetNode\n  depends_on: [b, ApplyNod]\nApplyNode:\n  type: Node\n  action: ApplyNode\n",
			want: []string{
				`task "a" (line 1): depends_on "b": no such task`,
				`task "a" (line 1): depends_on "ApplyNod": no such task (did you mean "ApplyNode"?)`,
			},
		},
		"self cycle": {
			file: "a:\n  type: Node\n  action: GetNode\n  depends_on: [a]\n",
			want: []string{`dependency cycle: "a" -> "a" (each task depends on the next)`},
		},
		"cycle": {
			file: `root:
  type: Node
  action: ListNodes
a:
  type: Node
  action: GetNode
  depends_on: [root, c]
b:
  type: Node
  action: GetNode
  depends_on: [a]
c:
  type: Node
  action: GetNode
  depends_on: [b]
`,
			want: []string{`dependency cycle: "a" -> "c" -> "b" -> "a" (each task depends on the next)`},
		},
		"every problem at once": {
			file: `x:
  type: Node
  action: Apply
  depends_on: [w, nope]
w:
  type: Network
  action: ApplyNetwork
  args: {name: n, vlan: 3}
  depends_on: [x]
  retry: 3
`,
			want: []string{
				`task "x" (line 1): unknown action "Apply" for type Node (valid: ApplyNode, DeleteNode, GetNode, ListNodes, ReleaseCompute, ReleaseStorage, ReserveCompute, ReserveStorage, ScheduleCompute, ScheduleStorage)`,
				`task "w" (line 5): unknown key "retry" (valid: type, action, args, depends_on, ignore_error)`,
				`task "w" (line 5): args of Network.ApplyNetwork: unknown field "vlan" in ApplyNetworkRequest (valid: name, annotations, labels, ipv4_cidr, ipv6_cidr, domain, ipv4_gateway, ipv6_gateway, dns_servers, vlan_id)`,
				`task "x" (line 1): depends_on "nope": no such task`,
				`dependency cycle: "x" -> "w" -> "x" (each task depends on the next)`,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			plan, err := Parse([]byte(tc.file))
			if plan != nil {
				t.Errorf("got a plan with an invalid file")
			}
			checkProblems(t, err, tc.want)
			if err != nil && !strings.HasPrefix(err.Error(), "invalid DAG file: ") {
				t.Errorf("error %q lacks the invalid DAG file prefix", err)
			}
		})
	}
}

func TestParsePlan(t *testing.T) {
	file := `# n0stack spelling and Corral spelling of types both work.
z_last:
  type: network
  action: ApplyNetwork
  args:
    name: lan
    ipv4Cidr: 10.0.0.0/24
    dns_servers: [10.0.0.1]
    annotations:
      n0core/provisioning/virtual_machine/vlan_id: "100"
  depends_on: [node, node]
node:
  type: Node
  action: ApplyNode
  args:
    name: n1
    cpu_milli_cores: 4000
    memory_bytes: 8589934592
reserve:
  type: block_storage
  action: GetBlockStorage
  args: {name: d}
  depends_on: [z_last]
  ignore_error: true
list:
  type: corral.pool.v1.NodeService
  action: ListNodes
`
	plan, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, task := range plan.Tasks {
		order = append(order, task.Name)
	}
	if diff := cmp.Diff([]string{"node", "z_last", "reserve", "list"}, order); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	net := plan.Task("z_last")
	if diff := cmp.Diff(&poolv1.ApplyNetworkRequest{
		Name: "lan", Ipv4Cidr: "10.0.0.0/24", DnsServers: []string{"10.0.0.1"},
		Annotations: map[string]string{"n0core/provisioning/virtual_machine/vlan_id": "100"},
	}, net.Request, protocmp.Transform()); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
	if net.Method.Path != "/corral.pool.v1.NetworkService/ApplyNetwork" || net.Method.Type != "Network" || net.Line != 2 {
		t.Errorf("z_last: path %s type %s line %d", net.Method.Path, net.Method.Type, net.Line)
	}
	if diff := cmp.Diff([]string{"node"}, net.DependsOn); diff != "" {
		t.Errorf("depends_on not deduplicated: %s", diff)
	}
	r := plan.Task("reserve")
	if !r.IgnoreError || r.Method.Path != "/corral.provisioning.v1.BlockStorageService/GetBlockStorage" {
		t.Errorf("reserve: %+v", r)
	}
	if !proto.Equal(r.Request, &provisioningv1.GetBlockStorageRequest{Name: "d"}) {
		t.Errorf("reserve request %v", r.Request)
	}
	if plan.Task("nope") != nil {
		t.Error("Task(nope) not nil")
	}
}

// TestEveryUnaryRPCReachable walks the registry on its own and checks that
// every unary RPC of every corral.<area>.v1 service resolves, with the
// right request and response types, and that streaming RPCs are refused.
func TestEveryUnaryRPCReachable(t *testing.T) {
	c := DefaultRegistry()
	n := 0
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "corral.") {
			return true
		}
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			typ := strings.TrimSuffix(string(sd.Name()), "Service")
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				m, err := c.Lookup(typ, string(md.Name()))
				if md.IsStreamingClient() || md.IsStreamingServer() {
					if err == nil || !strings.Contains(err.Error(), "streaming RPC") {
						t.Errorf("%s: streaming RPC not refused: %v", md.FullName(), err)
					}
					continue
				}
				n++
				if err != nil {
					t.Errorf("%s: %v", md.FullName(), err)
					continue
				}
				if want := "/" + string(sd.FullName()) + "/" + string(md.Name()); m.Path != want {
					t.Errorf("path %s, want %s", m.Path, want)
				}
				if m.Input.Descriptor().FullName() != md.Input().FullName() || m.Output.Descriptor().FullName() != md.Output().FullName() {
					t.Errorf("%s: types %s → %s", md.FullName(), m.Input.Descriptor().FullName(), m.Output.Descriptor().FullName())
				}
				if !m.Input.New().IsValid() {
					t.Errorf("%s: the request type makes no message", md.FullName())
				}
				// Both spellings reach it.
				if _, err := c.Lookup(snake(typ), string(md.Name())); err != nil {
					t.Errorf("snake_case type %s: %v", snake(typ), err)
				}
			}
		}
		return true
	})
	// Node 10, Network 6, BlockStorage 10, VirtualMachine 9, Image 9,
	// Machine 11, Hypervisor 14, Agent 2 (Session streams).
	if n < 60 {
		t.Errorf("only %d unary RPCs found; are the api packages linked?", n)
	}
	t.Logf("%d unary RPCs reachable", n)
}

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{"BlockStorage": "block_storage", "Node": "node", "VirtualMachine": "virtual_machine"} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}
