package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

func TestPoolVerbs(t *testing.T) {
	tests := map[string]struct {
		args   []string
		want   proto.Message // the request sent
		stdout string        // exact, or "" to only check it contains wantIn
		wantIn string
	}{
		"reserve-compute with sizes": {
			args: []string{"node", "reserve-compute", "n2", "vm9",
				"--request-cpu-milli-core", "1000", "--limit-cpu-milli-core=2000",
				"--request-memory-bytes", "512MiB", "--limit-memory-bytes", "1GiB",
				"--annotation", "owner=alice", "--annotation", "note=a=b"},
			want: &poolv1.ReserveComputeRequest{
				NodeName: "n2", ComputeName: "vm9",
				RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000,
				RequestMemoryBytes: 512 << 20, LimitMemoryBytes: 1 << 30,
				Annotations: map[string]string{"owner": "alice", "note": "a=b"},
			},
			stdout: `NAME   STATE       ADDRESS   RACK   CPU          MEMORY         STORAGE   RESERVATIONS
n2     NOT_READY   -         -      1000/8000m   512MiB/32GiB   0B/0B     compute=1,storage=0
`,
		},
		"reserve-compute decimal sizes json": {
			args: []string{"nodes", "reserve-compute", "n2", "vm9",
				"--request-cpu-milli-core", "500", "--limit-cpu-milli-core", "500",
				"--request-memory-bytes", "10G", "--limit-memory-bytes", "10000000000", "-o", "json"},
			want: &poolv1.ReserveComputeRequest{
				NodeName: "n2", ComputeName: "vm9",
				RequestCpuMilliCore: 500, LimitCpuMilliCore: 500,
				RequestMemoryBytes: 10e9, LimitMemoryBytes: 10e9,
			},
			wantIn: `"request_memory_bytes": "10000000000"`,
		},
		"schedule-compute": {
			args: []string{"node", "schedule-compute", "vm9",
				"--request-cpu-milli-core", "1000", "--limit-cpu-milli-core", "1000",
				"--request-memory-bytes", "1.5GiB", "--limit-memory-bytes", "1.5GiB"},
			want: &poolv1.ScheduleComputeRequest{
				ComputeName:         "vm9",
				RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000,
				RequestMemoryBytes: 3 << 29, LimitMemoryBytes: 3 << 29,
			},
			wantIn: "n1 ",
		},
		"release-compute": {
			args:   []string{"node", "release-compute", "n1", "vm1"},
			want:   &poolv1.ReleaseComputeRequest{NodeName: "n1", ComputeName: "vm1"},
			stdout: "node/n1: compute vm1 released\n",
		},
		"reserve-storage": {
			args: []string{"node", "reserve-storage", "n1", "disk2", "--request-bytes", "20GiB", "--limit-bytes", "40GiB", "-o", "yaml"},
			want: &poolv1.ReserveStorageRequest{
				NodeName: "n1", StorageName: "disk2", RequestBytes: 20 << 30, LimitBytes: 40 << 30,
			},
			wantIn: "name: n1\n",
		},
		"schedule-storage": {
			args:   []string{"node", "schedule-storage", "disk2", "--request-bytes", "1T", "--limit-bytes", "1TiB"},
			want:   &poolv1.ScheduleStorageRequest{StorageName: "disk2", RequestBytes: 1e12, LimitBytes: 1 << 40},
			wantIn: "n1 ",
		},
		"release-storage": {
			args:   []string{"node", "release-storage", "n1", "disk1"},
			want:   &poolv1.ReleaseStorageRequest{NodeName: "n1", StorageName: "disk1"},
			stdout: "node/n1: storage disk1 released\n",
		},
		"reserve-interface": {
			args: []string{"net", "reserve-interface", "lan", "vm9-eth0",
				"--hardware-address", "52:54:00:00:00:09", "--ipv4-address", "192.168.0.20", "--ipv6-address", "fd00::20"},
			want: &poolv1.ReserveNetworkInterfaceRequest{
				NetworkName: "lan", NetworkInterfaceName: "vm9-eth0",
				HardwareAddress: "52:54:00:00:00:09", Ipv4Address: "192.168.0.20", Ipv6Address: "fd00::20",
			},
			stdout: `NAME   STATE       IPV4             IPV6        GATEWAY               VLAN   INTERFACES
lan    AVAILABLE   192.168.0.0/24   fd00::/64   192.168.0.1,fd00::1   100    2
`,
		},
		"reserve-interface automatic": {
			args:   []string{"network", "reserve-interface", "lan", "vm9-eth0"},
			want:   &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm9-eth0"},
			wantIn: "lan ",
		},
		"release-interface": {
			args:   []string{"networks", "release-interface", "lan", "vm1-eth0"},
			want:   &poolv1.ReleaseNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm1-eth0"},
			stdout: "network/lan: interface vm1-eth0 released\n",
		},
		"delete": {
			args:   []string{"delete", "node", "n2"},
			want:   &poolv1.DeleteNodeRequest{Name: "n2"},
			stdout: "node/n2 deleted\n",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitOK || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if diff := cmp.Diff([]proto.Message{tt.want}, s.received(), protocmp.Transform()); diff != "" {
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
