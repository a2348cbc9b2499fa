package netdev

import (
	"errors"
	"regexp"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

var linkRE = regexp.MustCompile(`^c[bvt][a-z0-9]{0,5}[0-9a-f]{8}$`)

func TestNames(t *testing.T) {
	seen := map[string]string{}
	add := func(key, name string) {
		t.Helper()
		if len(name) > MaxNameLen || !linkRE.MatchString(name) {
			t.Errorf("%s -> %q: not a valid stable link name", key, name)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("%s and %s both map to %q", key, other, name)
		}
		seen[name] = key
	}
	for _, n := range []string{"default", "a", "A-Very-Long-Network-Name-Indeed", "net.1", "net_1", "x"} {
		add("bridge "+n, BridgeName(n))
	}
	for _, vm := range []string{"vm1", "vm10", "some-really-long-vm-name"} {
		for i := range 3 {
			add("tap "+vm, TapName(vm, i))
		}
	}
	add("vlan", VLANName("enp3s0f0np0", 4094))
	add("vlan", VLANName("eth0", 100))
	// Stable: same input, same name (golden values guard the algorithm).
	for got, want := range map[string]string{
		BridgeName("default"): "cbdefau" + BridgeName("default")[7:],
		TapName("vm1", 0):     "ctvm1" + TapName("vm1", 0)[5:],
	} {
		if got != want {
			t.Errorf("%q != %q", got, want)
		}
	}
	if BridgeName("default") != "cbdefauf2d90493" {
		t.Errorf("BridgeName(default) = %q changed: names must be stable across versions", BridgeName("default"))
	}
}

func TestPlanNetwork(t *testing.T) {
	tests := map[string]struct {
		n      Network
		uplink string
		want   Plan
		err    error
	}{
		"host-local": {n: Network{Name: "lan"}, want: Plan{Bridge: BridgeName("lan")}},
		"no vlan with uplink stays local": {n: Network{Name: "lan"}, uplink: "eth0",
			want: Plan{Bridge: BridgeName("lan")}},
		"vlan without uplink": {n: Network{Name: "lan", VLAN: 100},
			want: Plan{Bridge: BridgeName("lan"), Note: "vlan requested but the node has no uplink: host-local bridge"}},
		"vlan on uplink": {n: Network{Name: "lan", VLAN: 100}, uplink: "eth0",
			want: Plan{Bridge: BridgeName("lan"), VLANLink: VLANName("eth0", 100), VLANParent: "eth0", VLANID: 100}},
		"vlan too big":     {n: Network{Name: "lan", VLAN: 4095}, uplink: "eth0", err: apierr.ErrInvalid},
		"bad network name": {n: Network{Name: "../x"}, err: apierr.ErrInvalid},
		"bad uplink":       {n: Network{Name: "lan", VLAN: 5}, uplink: "this-is-far-too-long0", err: apierr.ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := PlanNetwork(tc.n, tc.uplink)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
}
