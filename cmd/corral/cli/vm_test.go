package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/emptypb"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// More behaviour of the fakes of fakes_test.go: the VM verbs.

func (f fakeVMs) GetVirtualMachine(_ context.Context, req *provisioningv1.GetVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	if err := f.r.record("GetVirtualMachine", req); err != nil {
		return nil, err
	}
	if req.GetName() != "vm1" {
		return nil, notFound()
	}
	return &provisioningv1.VirtualMachine{Name: "vm1", State: provisioningv1.VirtualMachine_RUNNING}, nil
}

func (f fakeVMs) BootVirtualMachine(_ context.Context, req *provisioningv1.BootVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	if err := f.r.record("BootVirtualMachine", req); err != nil {
		return nil, err
	}
	return &provisioningv1.VirtualMachine{Name: req.GetName(), State: provisioningv1.VirtualMachine_RUNNING}, nil
}

func (f fakeVMs) RebootVirtualMachine(_ context.Context, req *provisioningv1.RebootVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	if err := f.r.record("RebootVirtualMachine", req); err != nil {
		return nil, err
	}
	return &provisioningv1.VirtualMachine{Name: req.GetName(), State: provisioningv1.VirtualMachine_RUNNING}, nil
}

func (f fakeVMs) ShutdownVirtualMachine(_ context.Context, req *provisioningv1.ShutdownVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	if err := f.r.record("ShutdownVirtualMachine", req); err != nil {
		return nil, err
	}
	return &provisioningv1.VirtualMachine{Name: req.GetName(), State: provisioningv1.VirtualMachine_SHUTDOWN}, nil
}

func (f fakeVMs) DeleteVirtualMachine(_ context.Context, req *provisioningv1.DeleteVirtualMachineRequest) (*emptypb.Empty, error) {
	if err := f.r.record("DeleteVirtualMachine", req); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (f fakeVMs) OpenConsole(_ context.Context, req *provisioningv1.OpenConsoleRequest) (*provisioningv1.OpenConsoleResponse, error) {
	if err := f.r.record("OpenConsole", req); err != nil {
		return nil, err
	}
	return &provisioningv1.OpenConsoleResponse{ConsoleUrl: "vnc://10.0.0.11:5901"}, nil
}

// verbCase is one successful run: the requests it must send and what it
// must print (exactly, or containing wantIn).
type verbCase struct {
	args   []string
	want   []proto.Message
	stdout string
	wantIn string
}

func runVerbCases(t *testing.T, cases map[string]verbCase) {
	t.Helper()
	for name, tt := range cases {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if diff := cmp.Diff(tt.want, s.received(), protocmp.Transform()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			if tt.stdout != "" {
				if diff := cmp.Diff(tt.stdout, r.stdout); diff != "" {
					t.Errorf("stdout (-want +got):\n%s", diff)
				}
			}
			if !strings.Contains(r.stdout, tt.wantIn) {
				t.Errorf("stdout %q lacks %q", r.stdout, tt.wantIn)
			}
		})
	}
}

// badCase is a run that must fail with code, one stderr line containing
// stderrHas; usage errors must not reach the server.
type badCase struct {
	args      []string
	code      int
	stderrHas string
}

func runBadCases(t *testing.T, cases map[string]badCase) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderrHas) {
				t.Fatalf("exit %d, stderr %q; want %d containing %q", r.code, r.stderr, tc.code, tc.stderrHas)
			}
			checkOneLine(t, r.stderr)
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if tc.code == ExitUsage {
				if got := s.received(); len(got) != 0 {
					t.Errorf("usage error sent %d request(s): %v", len(got), got)
				}
			}
		})
	}
}

func checkOneLine(t *testing.T, stderr string) {
	t.Helper()
	if !strings.HasPrefix(stderr, "corral: ") || !strings.HasSuffix(stderr, "\n") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr %q is not one 'corral: ...' line", stderr)
	}
}

func writeTestFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVMVerbs(t *testing.T) {
	keys := writeTestFile(t, "keys.pub", "# alice's keys\nssh-ed25519 AAAAC3Nza alice@laptop\n\n  ssh-rsa AAAAB3Nza alice@old  \n")
	more := writeTestFile(t, "bob.pub", "ssh-ed25519 AAAAbob bob\n")
	runVerbCases(t, map[string]verbCase{
		"create with everything": {
			args: []string{"vm", "create", "web1",
				"--limit-cpu-milli-core", "2000", "--request-cpu-milli-core=500",
				"--limit-memory-bytes", "2GiB", "--request-memory-bytes", "2048MiB",
				"--disk", "web1-root", "--disk", "web1-data",
				"--nic", "lan=192.168.0.20", "--nic", "wan=203.0.113.5,2001:db8::5", "--nic", "mgmt",
				"--login-user", "alice", "--ssh-key-file", keys, "--ssh-key-file", more,
				"--node", "n2", "--annotation", "owner=alice", "--label", "tier=web", "--label", "env=prod",
				"--uuid", "3f2a9c1e-0000-4000-8000-000000000001"},
			want: []proto.Message{&provisioningv1.CreateVirtualMachineRequest{
				Name: "web1",
				Annotations: map[string]string{
					"owner": "alice",
					"n0core/provisioning/virtual_machine/request_node_name": "n2",
				},
				Labels:              map[string]string{"tier": "web", "env": "prod"},
				RequestCpuMilliCore: 500, LimitCpuMilliCore: 2000,
				RequestMemoryBytes: 2 << 30, LimitMemoryBytes: 2 << 30,
				BlockStorageNames: []string{"web1-root", "web1-data"},
				Nics: []*provisioningv1.VirtualMachineNIC{
					{NetworkName: "lan", Ipv4Address: "192.168.0.20"},
					{NetworkName: "wan", Ipv4Address: "203.0.113.5", Ipv6Address: "2001:db8::5"},
					{NetworkName: "mgmt"},
				},
				Uuid:              "3f2a9c1e-0000-4000-8000-000000000001",
				LoginUsername:     "alice",
				SshAuthorizedKeys: []string{"ssh-ed25519 AAAAC3Nza alice@laptop", "ssh-rsa AAAAB3Nza alice@old", "ssh-ed25519 AAAAbob bob"},
			}},
			stdout: "NAME   STATE         NODE   CPU   MEMORY   DISKS   ADDRESSES\nweb1   UNSPECIFIED   -      0m    0B       -       -\n",
		},
		"create requests default to limits": {
			args: []string{"vm", "create", "vm9", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "1.5G", "-o", "json"},
			want: []proto.Message{&provisioningv1.CreateVirtualMachineRequest{
				Name: "vm9", RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1.5e9, LimitMemoryBytes: 1.5e9,
			}},
			stdout: "{\n  \"name\": \"vm9\"\n}\n",
		},
		"create --node equal to annotation": {
			args: []string{"vms", "create", "vm9", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "1GiB",
				"--node", "n1", "--annotation", "n0core/provisioning/virtual_machine/request_node_name=n1"},
			want: []proto.Message{&provisioningv1.CreateVirtualMachineRequest{
				Name: "vm9", RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30,
				Annotations: map[string]string{"n0core/provisioning/virtual_machine/request_node_name": "n1"},
			}},
		},
		"boot": {
			args:   []string{"vm", "boot", "vm1"},
			want:   []proto.Message{&provisioningv1.BootVirtualMachineRequest{Name: "vm1"}},
			stdout: "NAME   STATE     NODE   CPU   MEMORY   DISKS   ADDRESSES\nvm1    RUNNING   -      0m    0B       -       -\n",
		},
		"reboot": {
			args: []string{"vm", "reboot", "vm1"},
			want: []proto.Message{&provisioningv1.RebootVirtualMachineRequest{Name: "vm1"}},
		},
		"reboot hard yaml": {
			args:   []string{"vm", "reboot", "vm1", "--hard", "-o", "yaml"},
			want:   []proto.Message{&provisioningv1.RebootVirtualMachineRequest{Name: "vm1", Hard: true}},
			stdout: "name: vm1\nstate: RUNNING\n",
		},
		"shutdown": {
			args:   []string{"vm", "shutdown", "vm1"},
			want:   []proto.Message{&provisioningv1.ShutdownVirtualMachineRequest{Name: "vm1"}},
			wantIn: "SHUTDOWN",
		},
		"shutdown hard": {
			args: []string{"vm", "shutdown", "--hard", "vm1"},
			want: []proto.Message{&provisioningv1.ShutdownVirtualMachineRequest{Name: "vm1", Hard: true}},
		},
		"delete": {
			args:   []string{"vm", "delete", "vm1"},
			want:   []proto.Message{&provisioningv1.DeleteVirtualMachineRequest{Name: "vm1"}},
			stdout: "virtual_machine/vm1 deleted\n",
		},
		"console": {
			args:   []string{"vm", "console", "vm1", "--vnc"},
			want:   []proto.Message{&provisioningv1.OpenConsoleRequest{Name: "vm1"}},
			stdout: "vnc://10.0.0.11:5901\n",
		},
		"console json": {
			args:   []string{"vm", "console", "vm1", "--vnc", "-o", "json"},
			want:   []proto.Message{&provisioningv1.OpenConsoleRequest{Name: "vm1"}},
			stdout: "{\n  \"console_url\": \"vnc://10.0.0.11:5901\"\n}\n",
		},
		"get one vm": {
			args:   []string{"get", "vm", "vm1"},
			want:   []proto.Message{&provisioningv1.GetVirtualMachineRequest{Name: "vm1"}},
			wantIn: "vm1    RUNNING",
		},
		"describe vm": {
			args:   []string{"describe", "vm", "vm1"},
			want:   []proto.Message{&provisioningv1.GetVirtualMachineRequest{Name: "vm1"}},
			stdout: "name: vm1\nstate: RUNNING\n",
		},
	})
}

func TestVMBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := writeTestFile(t, "empty.pub", "# nothing\n\n")
	private := writeTestFile(t, "id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n")
	create := []string{"vm", "create", "vm9", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "1GiB"}
	with := func(extra ...string) []string { return append(append([]string(nil), create...), extra...) }
	runBadCases(t, map[string]badCase{
		"bad memory size":          {[]string{"vm", "create", "vm9", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "4XB"}, ExitUsage, `unknown unit "XB"`},
		"negative memory":          {with("--request-memory-bytes", "-1"), ExitUsage, "size"},
		"bad cpu":                  {[]string{"vm", "create", "vm9", "--limit-cpu-milli-core", "two", "--limit-memory-bytes", "1GiB"}, ExitUsage, "limit-cpu-milli-core"},
		"zero cpu":                 {[]string{"vm", "create", "vm9", "--limit-cpu-milli-core", "0", "--limit-memory-bytes", "1GiB"}, ExitUsage, "must be positive"},
		"missing cpu":              {[]string{"vm", "create", "vm9", "--limit-memory-bytes", "1GiB"}, ExitUsage, `"limit-cpu-milli-core" not set`},
		"missing memory":           {[]string{"vm", "create", "vm9", "--limit-cpu-milli-core", "1000"}, ExitUsage, `"limit-memory-bytes" not set`},
		"missing name":             {[]string{"vm", "create", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "1GiB"}, ExitUsage, "wrong number of arguments"},
		"nic bad ip":               {with("--nic", "lan=192.168.0.300"), ExitUsage, `"192.168.0.300" is not an IP address`},
		"nic with prefix":          {with("--nic", "lan=192.168.0.3/24"), ExitUsage, "without a prefix length"},
		"nic two ipv4":             {with("--nic", "lan=10.0.0.1,10.0.0.2"), ExitUsage, "more than one IPv4"},
		"nic empty ip":             {with("--nic", "lan="), ExitUsage, "not an IP address"},
		"nic no network":           {with("--nic", "=10.0.0.1"), ExitUsage, "want NETWORK"},
		"empty disk":               {with("--disk", ""), ExitUsage, "--disk"},
		"missing ssh key file":     {with("--ssh-key-file", filepath.Join(dir, "nope.pub")), ExitUsage, "no such file"},
		"ssh key file a directory": {with("--ssh-key-file", dir), ExitUsage, "is a directory"},
		"empty ssh key file":       {with("--ssh-key-file", empty), ExitUsage, "holds no key"},
		"private ssh key":          {with("--ssh-key-file", private), ExitUsage, "private key"},
		"node contradicts":         {with("--node", "n1", "--annotation", "n0core/provisioning/virtual_machine/request_node_name=n2"), ExitUsage, "contradicts"},
		"bad annotation":           {with("--annotation", "novalue"), ExitUsage, "want KEY=VALUE"},
		"bad label":                {with("--label", "=x"), ExitUsage, "--label"},
		"duplicate label":          {with("--label", "a=1", "--label", "a=2"), ExitUsage, "given twice"},
		"bad output":               {with("-o", "xml"), ExitUsage, "unknown output format"},
		"unknown flag":             {with("--cpus", "2"), ExitUsage, "unknown flag"},
		"missing verb":             {[]string{"vm"}, ExitUsage, "missing vm verb"},
		"unknown verb":             {[]string{"vm", "explode", "vm1"}, ExitUsage, `unknown vm verb "explode"`},
		"boot needs a name":        {[]string{"vm", "boot"}, ExitUsage, "wrong number of arguments"},
		"reboot bad output":        {[]string{"vm", "reboot", "vm1", "-o", "csv"}, ExitUsage, "unknown output format"},
		"console two names":        {[]string{"vm", "console", "a", "b"}, ExitUsage, "wrong number of arguments"},
		"console -o without vnc":   {[]string{"vm", "console", "a", "-o", "json"}, ExitUsage, "-o is for --vnc"},
		"console vnc read-only":    {[]string{"vm", "console", "a", "--vnc", "--read-only"}, ExitUsage, "drop --vnc"},
		"console read-only take":   {[]string{"vm", "console", "a", "--read-only", "--take"}, ExitUsage, "drop --read-only"},
		"get unknown vm":           {[]string{"get", "vm", "nope"}, ExitError, `virtual_machine "nope": not found (NotFound)`},
	})
}

func TestVMServerErrors(t *testing.T) {
	for method, args := range map[string][]string{
		"CreateVirtualMachine":   {"vm", "create", "vm9", "--limit-cpu-milli-core", "1000", "--limit-memory-bytes", "1GiB"},
		"BootVirtualMachine":     {"vm", "boot", "vm9"},
		"RebootVirtualMachine":   {"vm", "reboot", "vm9", "--hard"},
		"ShutdownVirtualMachine": {"vm", "shutdown", "vm9"},
		"DeleteVirtualMachine":   {"vm", "delete", "vm9"},
		"OpenConsole":            {"vm", "console", "vm9", "--vnc"},
	} {
		t.Run(method, func(t *testing.T) {
			s := newTestServer(t)
			s.fail[method] = status.Error(codes.FailedPrecondition, "node \"n1\" is NOT_READY\n(last heartbeat 2m ago)")
			r := s.run(t, "", nil, args...)
			if r.code != ExitError || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
			}
			checkOneLine(t, r.stderr)
			if !strings.Contains(r.stderr, `virtual_machine "vm9": node "n1" is NOT_READY (last heartbeat 2m ago) (FailedPrecondition)`) {
				t.Errorf("stderr %q", r.stderr)
			}
		})
	}
}

func TestVMTable(t *testing.T) {
	vms := []proto.Message{
		&provisioningv1.VirtualMachine{
			Name: "web1", State: provisioningv1.VirtualMachine_RUNNING, ComputeNodeName: "n1",
			RequestCpuMilliCore: 2000, LimitCpuMilliCore: 2000, RequestMemoryBytes: 4 << 30, LimitMemoryBytes: 4 << 30,
			BlockStorageNames: []string{"web1-root", "web1-data"},
			Nics: []*provisioningv1.VirtualMachineNIC{
				{NetworkName: "lan", Ipv4Address: "192.168.0.20", Ipv6Address: "fd00::20"},
				{NetworkName: "wan"},
			},
		},
		&provisioningv1.VirtualMachine{
			Name: "db1", State: provisioningv1.VirtualMachine_RUNNING, ComputeNodeName: "n2",
			Annotations:         map[string]string{annVMNodeStatus: `node "n2" is NOT_READY`},
			RequestCpuMilliCore: 500, LimitCpuMilliCore: 1000, RequestMemoryBytes: 512 << 20, LimitMemoryBytes: 512 << 20,
		},
	}
	var b strings.Builder
	if err := printRecords(&b, virtualMachineKind, vms, true, formatTable); err != nil {
		t.Fatal(err)
	}
	want := `NAME   STATE                 NODE   CPU         MEMORY   DISKS                 ADDRESSES
web1   RUNNING               n1     2000m       4GiB     web1-root,web1-data   lan=192.168.0.20,lan=fd00::20,wan
db1    RUNNING(unverified)   n2     500/1000m   512MiB   -                     -
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}
