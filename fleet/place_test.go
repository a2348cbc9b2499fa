package fleet

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlace(t *testing.T) {
	type runner struct {
		name     string
		bmc      []string
		boot     []string
		assigned int
	}
	type want struct {
		Runner, Reason string
	}
	tests := map[string]struct {
		runners   []runner
		bmc, boot string
		want      want
	}{
		"least loaded": {
			runners: []runner{{name: "a", assigned: 3}, {name: "b", assigned: 1}, {name: "c", assigned: 2}},
			want:    want{"b", "least loaded of 3"},
		},
		"ties by name": {
			runners: []runner{{name: "b"}, {name: "a"}},
			want:    want{"a", "least loaded of 2"},
		},
		"bmc affinity beats load": {
			runners: []runner{{name: "a", bmc: []string{"10.0.0.0/24"}, assigned: 9}, {name: "b", bmc: []string{"10.0.1.0/24"}}},
			bmc:     "10.0.0.7",
			want:    want{"a", "affinity: bmc network 10.0.0.0/24"},
		},
		"a matching network beats any": {
			runners: []runner{{name: "a", assigned: 0}, {name: "b", bmc: []string{"10.0.0.0/16"}, assigned: 5}},
			bmc:     "10.0.3.7",
			want:    want{"b", "affinity: bmc network 10.0.0.0/16"},
		},
		"bmc and boot segment": {
			runners: []runner{
				{name: "a", bmc: []string{"10.0.0.0/24"}, boot: []string{"192.168.9.0/24"}},
				{name: "b", bmc: []string{"10.0.0.0/24"}, boot: []string{"192.168.1.0/24"}},
			},
			bmc: "10.0.0.7", boot: "192.168.1.20",
			want: want{"b", "affinity: bmc network 10.0.0.0/24 and boot segment 192.168.1.0/24"},
		},
		"affinity ties go to the least loaded": {
			runners: []runner{{name: "a", bmc: []string{"10.0.0.0/24"}, assigned: 2}, {name: "b", bmc: []string{"10.0.0.0/24"}, assigned: 1}},
			bmc:     "10.0.0.7",
			want:    want{"b", "affinity: bmc network 10.0.0.0/24 (least loaded of 2)"},
		},
		"unknown bmc is not constrained": {
			runners: []runner{{name: "a", bmc: []string{"10.0.0.0/24"}, assigned: 1}, {name: "b", bmc: []string{"10.0.1.0/24"}}},
			want:    want{"b", "least loaded of 2"},
		},
		"no runner reaches it": {
			runners: []runner{{name: "a", bmc: []string{"10.0.0.0/24"}, assigned: 1}, {name: "b", bmc: []string{"10.0.1.0/24"}}},
			bmc:     "172.16.0.1",
			want:    want{"b", "no live runner's networks contain bmc 172.16.0.1: least loaded of 2"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var cands []*candidate
			for _, r := range tt.runners {
				cands = append(cands, &candidate{name: r.name, bmcNets: lenientNets(r.bmc), bootSegs: lenientNets(r.boot), assigned: r.assigned})
			}
			var tg target
			if tt.bmc != "" {
				tg.bmc = netip.MustParseAddr(tt.bmc)
			}
			if tt.boot != "" {
				tg.boot = netip.MustParseAddr(tt.boot)
			}
			c, reason := place(cands, tg)
			if diff := cmp.Diff(tt.want, want{c.name, reason}); diff != "" {
				t.Errorf("place (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckAppliance(t *testing.T) {
	tests := map[string]struct {
		name, endpoint string
		bmc            []string
		wantErr        string
	}{
		"ok":           {name: "a1", endpoint: "10.0.0.1:20180", bmc: []string{"10.0.0.0/24"}},
		"no endpoint":  {name: "a1"},
		"empty name":   {wantErr: "appliance name is required (--appliance-name)"},
		"bad name":     {name: "-a", wantErr: `appliance name "-a" is malformed: use 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit`},
		"bad endpoint": {name: "a1", endpoint: "10.0.0.1", wantErr: `appliance a1: API endpoint "10.0.0.1" is not host:port`},
		"bad network":  {name: "a1", bmc: []string{"10.0.0.0"}, wantErr: `appliance a1: BMC network (--bmc-network) "10.0.0.0" is not a CIDR (e.g. 10.0.0.0/24)`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := CheckAppliance(appliance(tt.name, tt.endpoint, tt.bmc, nil))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("CheckAppliance = %q, want %q", got, tt.wantErr)
			}
		})
	}
}
