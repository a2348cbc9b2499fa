package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"sigs.k8s.io/yaml"
)

const n1JSON = `{
  "name": "n1",
  "labels": {
    "tier": "gold"
  },
  "address": "10.0.0.11",
  "cpu_milli_cores": 16000,
  "memory_bytes": "68719476736",
  "storage_bytes": "1099511627776",
  "rack": "r1",
  "state": "READY",
  "reserved_computes": {
    "vm1": {
      "request_cpu_milli_core": 1500,
      "limit_cpu_milli_core": 2000,
      "request_memory_bytes": "1610612736",
      "limit_memory_bytes": "2147483648"
    }
  },
  "reserved_storages": {
    "disk1": {
      "request_bytes": "107374182400",
      "limit_bytes": "214748364800"
    }
  },
  "last_heartbeat": "2025-03-01T12:00:00Z"
}
`

const n1YAML = `address: 10.0.0.11
cpu_milli_cores: 16000
labels:
  tier: gold
last_heartbeat: "2025-03-01T12:00:00Z"
memory_bytes: "68719476736"
name: n1
rack: r1
reserved_computes:
  vm1:
    limit_cpu_milli_core: 2000
    limit_memory_bytes: "2147483648"
    request_cpu_milli_core: 1500
    request_memory_bytes: "1610612736"
reserved_storages:
  disk1:
    limit_bytes: "214748364800"
    request_bytes: "107374182400"
state: READY
storage_bytes: "1099511627776"
`

func TestGet(t *testing.T) {
	tests := map[string]struct {
		empty bool // run against a server with no records
		args  []string
		want  string
	}{
		"nodes table": {
			args: []string{"get", "node"},
			want: `NAME   STATE       ADDRESS     RACK   CPU           MEMORY         STORAGE       RESERVATIONS
n1     READY       10.0.0.11   r1     1500/16000m   1.5GiB/64GiB   100GiB/1TiB   compute=1,storage=1
n2     NOT_READY   -           -      0/8000m       0B/32GiB       0B/0B         compute=0,storage=0
`,
		},
		"one node table": {
			args: []string{"get", "nodes", "n2"},
			want: `NAME   STATE       ADDRESS   RACK   CPU       MEMORY     STORAGE   RESERVATIONS
n2     NOT_READY   -         -      0/8000m   0B/32GiB   0B/0B     compute=0,storage=0
`,
		},
		"one node json": {
			args: []string{"get", "node", "n1", "-o", "json"},
			want: n1JSON,
		},
		"one node yaml": {
			args: []string{"get", "node", "n1", "--output=yaml"},
			want: n1YAML,
		},
		"describe node": {
			args: []string{"describe", "node", "n1"},
			want: n1YAML,
		},
		"nodes json": {
			args: []string{"get", "node", "-o", "json"},
			want: `[
  {
    "name": "n1",
    "labels": {
      "tier": "gold"
    },
    "address": "10.0.0.11",
    "cpu_milli_cores": 16000,
    "memory_bytes": "68719476736",
    "storage_bytes": "1099511627776",
    "rack": "r1",
    "state": "READY",
    "reserved_computes": {
      "vm1": {
        "request_cpu_milli_core": 1500,
        "limit_cpu_milli_core": 2000,
        "request_memory_bytes": "1610612736",
        "limit_memory_bytes": "2147483648"
      }
    },
    "reserved_storages": {
      "disk1": {
        "request_bytes": "107374182400",
        "limit_bytes": "214748364800"
      }
    },
    "last_heartbeat": "2025-03-01T12:00:00Z"
  },
  {
    "name": "n2",
    "cpu_milli_cores": 8000,
    "memory_bytes": "34359738368",
    "state": "NOT_READY"
  }
]
`,
		},
		"no nodes table": {
			empty: true,
			args:  []string{"get", "nodes"},
			want:  "No nodes.\n",
		},
		"no nodes json": {
			empty: true,
			args:  []string{"get", "nodes", "-o", "json"},
			want:  "[]\n",
		},
		"no nodes yaml": {
			empty: true,
			args:  []string{"get", "nodes", "-o", "yaml"},
			want:  "[]\n",
		},
		"networks table": {
			args: []string{"get", "networks"},
			want: `NAME   STATE         IPV4             IPV6        GATEWAY               VLAN   INTERFACES
lan    AVAILABLE     192.168.0.0/24   fd00::/64   192.168.0.1,fd00::1   100    1
wan    UNSPECIFIED   203.0.113.0/28   -           -                     -      0
`,
		},
		"machines table": {
			args: []string{"get", "machine"},
			want: `NAME   SERIAL   VENDOR/PRODUCT             CPUS   MEMORY   DISKS      STATE        POWER         LAST-SEEN
m1     SN123    Dell Inc. PowerEdge R650   64     256GiB   2 (4TiB)   DEPLOYED!    ON            -
m2     -        -                          -      -        -          DISCOVERED   UNSPECIFIED   -
`,
		},
		"virtual machines table": {
			args: []string{"get", "vm"},
			want: `NAME   STATE     NODE   CPU       MEMORY    DISKS   ADDRESSES
vm1    RUNNING   n1     0/2000m   0B/4GiB   disk1   lan=192.168.0.10
`,
		},
		"block storages table": {
			args: []string{"get", "bs"},
			want: `NAME    STATE    NODE   SIZE          USED-BY
disk1   IN_USE   n1     10GiB/20GiB   -
`,
		},
		"images table": {
			args: []string{"get", "images"},
			want: `NAME     TAGS               REGISTERED
debian   latest=debian-12   debian-12
`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			if !tt.empty {
				seed(s)
			}
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if diff := cmp.Diff(tt.want, r.stdout); diff != "" {
				t.Errorf("stdout (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKindAliases(t *testing.T) {
	tests := map[string]struct {
		kind string
		want proto.Message // the List request the alias must send
	}{
		"node":            {"node", &poolv1.ListNodesRequest{PageSize: 500}},
		"nodes":           {"nodes", &poolv1.ListNodesRequest{PageSize: 500}},
		"network":         {"network", &poolv1.ListNetworksRequest{PageSize: 500}},
		"networks":        {"networks", &poolv1.ListNetworksRequest{PageSize: 500}},
		"net":             {"net", &poolv1.ListNetworksRequest{PageSize: 500}},
		"virtual_machine": {"virtual_machine", &provisioningv1.ListVirtualMachinesRequest{PageSize: 500}},
		"vm":              {"vm", &provisioningv1.ListVirtualMachinesRequest{PageSize: 500}},
		"vms":             {"vms", &provisioningv1.ListVirtualMachinesRequest{PageSize: 500}},
		"VirtualMachine":  {"VirtualMachine", &provisioningv1.ListVirtualMachinesRequest{PageSize: 500}},
		"block_storage":   {"block_storage", &provisioningv1.ListBlockStoragesRequest{PageSize: 500}},
		"bs":              {"bs", &provisioningv1.ListBlockStoragesRequest{PageSize: 500}},
		"image":           {"image", &deploymentv1.ListImagesRequest{PageSize: 500}},
		"images":          {"images", &deploymentv1.ListImagesRequest{PageSize: 500}},
		"machine":         {"machine", &inventoryv1.ListMachinesRequest{PageSize: 500, View: inventoryv1.MachineView_MACHINE_VIEW_FULL}},
		"machines":        {"machines", &inventoryv1.ListMachinesRequest{PageSize: 500, View: inventoryv1.MachineView_MACHINE_VIEW_FULL}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, "get", tt.kind, "-o", "json")
			if r.code != ExitOK {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if diff := cmp.Diff([]proto.Message{tt.want}, s.received(), protocmp.Transform()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLookupKind(t *testing.T) {
	tests := map[string]struct {
		want string // canonical kind; "" when unknown
	}{
		"bs":              {"block_storage"},
		"vm":              {"virtual_machine"},
		"net":             {"network"},
		"Virtual-Machine": {"virtual_machine"},
		"BlockStorage":    {"block_storage"},
		"nodes":           {"node"},
		"":                {""},
		"pod":             {""},
		"n":               {""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := ""
			if k, ok := lookupKind(name); ok {
				got = k.name
			}
			if got != tt.want {
				t.Errorf("lookupKind(%q) = %q, want %q", name, got, tt.want)
			}
		})
	}
}

func TestGetMachineFilters(t *testing.T) {
	cases := map[string]struct {
		args []string
		want *inventoryv1.ListMachinesRequest
		code int
	}{
		"state and selectors": {
			args: []string{"get", "machines", "--state", "inventoried", "-l", "memory_bytes>=64Gi", "--selector", "disk.count>=2"},
			want: &inventoryv1.ListMachinesRequest{State: inventoryv1.Machine_INVENTORIED, Selectors: []string{"memory_bytes>=64Gi", "disk.count>=2"}, PageSize: 500, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY},
		},
		"serial and mac": {
			args: []string{"get", "machine", "--serial", "SN123", "--mac", "aa:bb:cc:dd:ee:01"},
			want: &inventoryv1.ListMachinesRequest{Serial: "SN123", Mac: "aa:bb:cc:dd:ee:01", PageSize: 500, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY},
		},
		"bad state":        {args: []string{"get", "machines", "--state", "sleeping"}, code: ExitUsage},
		"filter on nodes":  {args: []string{"get", "nodes", "--state", "deployed"}, code: ExitUsage},
		"filter with name": {args: []string{"get", "machine", "m1", "--serial", "x"}, code: ExitUsage},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			r := s.run(t, "", nil, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d (%s), want %d", r.code, r.stderr, tc.code)
			}
			var got []proto.Message
			for _, m := range s.received() {
				if _, ok := m.(*inventoryv1.ListMachinesRequest); ok {
					got = append(got, m)
				}
			}
			if tc.want == nil {
				if len(got) != 0 {
					t.Fatalf("usage error sent %d requests", len(got))
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("%d ListMachines requests", len(got))
			}
			if diff := cmp.Diff(tc.want, got[0], protocmp.Transform()); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}

// TestGetFormatsEveryKind: -o name, wide, json and yaml for each kind.
func TestGetFormatsEveryKind(t *testing.T) {
	kinds := map[string]struct {
		kind  *kind
		names []string // the seeded records, sorted
	}{
		"node":    {nodeKind, []string{"n1", "n2"}},
		"network": {networkKind, []string{"lan", "wan"}},
		"vm":      {virtualMachineKind, []string{"vm1"}},
		"bs":      {blockStorageKind, []string{"disk1"}},
		"image":   {imageKind, []string{"debian"}},
		"machine": {machineKind, []string{"m1", "m2"}},
	}
	for arg, tk := range kinds {
		for _, format := range []string{"name", "wide", "json", "yaml"} {
			t.Run(arg+" "+format, func(t *testing.T) {
				s := newTestServer(t)
				seed(s)
				r := s.run(t, "", nil, "get", arg, "-o", format)
				if r.code != ExitOK || r.stderr != "" {
					t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
				}
				var got []string
				switch format {
				case "name":
					got = append(got, strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")...)
					var want []string
					for _, n := range tk.names {
						want = append(want, tk.kind.name+"/"+n)
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("names (-want +got):\n%s", diff)
					}
					return
				case "wide":
					lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
					header := strings.Fields(lines[0])
					if diff := cmp.Diff(append(append([]string(nil), tk.kind.columns...), tk.kind.wide...), header); diff != "" {
						t.Errorf("wide header (-want +got):\n%s", diff)
					}
					for _, l := range lines[1:] {
						got = append(got, strings.Fields(l)[0])
					}
				case "json", "yaml":
					b := []byte(r.stdout)
					if format == "yaml" {
						var err error
						if b, err = yaml.YAMLToJSON(b); err != nil {
							t.Fatal(err)
						}
					}
					var items []map[string]any
					if err := json.Unmarshal(b, &items); err != nil {
						t.Fatalf("%v:\n%s", err, r.stdout)
					}
					for _, it := range items {
						got = append(got, it["name"].(string))
					}
				}
				if diff := cmp.Diff(tk.names, got); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestGetWide(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"machines": {
			args: []string{"get", "machines", "-o", "wide"},
			want: `NAME   SERIAL   VENDOR/PRODUCT             CPUS   MEMORY   DISKS      STATE        POWER         LAST-SEEN   MACS                                  BMC                  CPU-MODEL   INTENT        NODE   REASON   ZONE   POOL   OWNER   LABELS
m1     SN123    Dell Inc. PowerEdge R650   64     256GiB   2 (4TiB)   DEPLOYED!    ON            -           aa:bb:cc:dd:ee:01,aa:bb:cc:dd:ee:09   10.0.0.21(ipmitool)  -           HYPERVISOR    n1     -        -      -      -       -
m2     -        -                          -      -        -          DISCOVERED   UNSPECIFIED   -           aa:bb:cc:dd:ee:02                     -                    -           UNSPECIFIED   -      -        -      -      -       -
`,
		},
		"one node": {
			args: []string{"get", "node", "n1", "-o", "wide"},
			want: `NAME   STATE   ADDRESS     RACK   CPU           MEMORY         STORAGE       RESERVATIONS          SERIAL   BMC   LOCATION   HYPERVISOR        LAST-HEARTBEAT   LABELS
n1     READY   10.0.0.11   r1     1500/16000m   1.5GiB/64GiB   100GiB/1TiB   compute=1,storage=1   -        -     r1         10.0.0.11:20181   AGE              tier=gold
`,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			s.mu.Lock()
			m1 := s.machines["m1"]
			m1.Macs = []string{"aa:bb:cc:dd:ee:09"}
			m1.Bmc = &inventoryv1.Bmc{Address: "10.0.0.21", Provider: "ipmitool"}
			m1.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR
			s.mu.Unlock()
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitOK {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			got := lastHeartbeatAge.ReplaceAllString(r.stdout, "AGE")
			// Compare cells: the heartbeat's age changes the alignment.
			gl, wl := strings.Split(got, "\n"), strings.Split(tt.want, "\n")
			if len(gl) != len(wl) {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tt.want)
			}
			for i := range wl {
				if diff := cmp.Diff(strings.Fields(wl[i]), strings.Fields(gl[i])); diff != "" {
					t.Errorf("line %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

var lastHeartbeatAge = regexp.MustCompile(`\S+ ago`)
