package main

// Attack test for the LLDP neighbours a report carries (docs/operator-guide.md,
// "LLDP neighbours"): what a neighbour says is whatever a machine on the
// boot LAN, or anything on its segment, put on the wire. Against the built
// corrald with --lldp-labels: a real gRPC client over TLS for the agent
// edge and the operator, the built corral for describe.

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// TestAttackLLDPNeighbours: a report listing more neighbours on a NIC than
// the cap, or a neighbour whose name holds a terminal escape, is refused
// InvalidArgument naming the field, and the machine's record is unchanged;
// a neighbour whose names try to write other labels (separators, '=',
// 300 bytes) sets only the three switch labels, as label values; describe
// prints the neighbour without a raw control character.
func TestAttackLLDPNeighbours(t *testing.T) {
	c := startCredCorrald(t, "--lldp-labels")
	ctx := context.Background()
	const mac, from = "52:54:00:cc:11:01", "127.0.3.11"
	agent := c.agent(c.token(mac, from))
	withNeighbours := func(ns ...*inventoryv1.Facts_LldpNeighbor) *inventoryv1.Facts {
		f := machinefacts.QEMU("SN-LLDP-1", "", mac)
		f.Nics[0].LldpNeighbors = ns
		return f
	}
	reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: withNeighbours(&inventoryv1.Facts_LldpNeighbor{ChassisId: "aa:bb:cc:00:00:01", PortId: "Ethernet1/12", SystemName: "tor-1", VlanId: 42})})
	if err != nil {
		t.Fatalf("Register with one neighbour: %v", err)
	}
	name := reg.GetMachineName()
	before := c.machine(name)
	if l := before.GetLabels(); l[inventory.LabelSwitch] != "tor-1" || l[inventory.LabelSwitchPort] != "Ethernet1-12" || l[inventory.LabelSwitchVLAN] != "42" {
		t.Fatalf("labels after an honest neighbour: %v", l)
	}

	t.Run("refused, the record unchanged", func(t *testing.T) {
		var five []*inventoryv1.Facts_LldpNeighbor
		for range inventory.MaxLLDPNeighbors + 1 {
			five = append(five, &inventoryv1.Facts_LldpNeighbor{ChassisId: "aa:bb:cc:00:00:02", PortId: "p"})
		}
		for what, tc := range map[string]struct {
			f    *inventoryv1.Facts
			says []string
		}{
			"five neighbours on a NIC":           {withNeighbours(five...), []string{"nics[0] lists 5 LLDP neighbours, at most 4"}},
			"an escape in a name":                {withNeighbours(&inventoryv1.Facts_LldpNeighbor{ChassisId: "x", SystemName: "tor" + escTitle}), []string{"system_name", `\x1b]0;owned\x07`}},
			"a C1 control in a port description": {withNeighbours(&inventoryv1.Facts_LldpNeighbor{ChassisId: "x", PortDescription: "uplink\u009b2J"}), []string{"port_description"}},
		} {
			_, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: tc.f})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument {
				t.Errorf("%s: Register = %v; want InvalidArgument", what, err)
				continue
			}
			for _, s := range tc.says {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("%s: %q does not say %q", what, st.Message(), s)
				}
			}
			assertNoRaw(t, what+" refusal", st.Message())
		}
		if diff := cmp.Diff(before, c.machine(name), protocmp.Transform()); diff != "" {
			t.Errorf("the machine's record changed (-before +after):\n%s", diff)
		}
	})

	t.Run("names cannot write other labels", func(t *testing.T) {
		evil := &inventoryv1.Facts_LldpNeighbor{
			ChassisId:  "aa:bb:cc:00:00:03",
			SystemName: "tor-2,corral.dev/zone=gold " + strings.Repeat("x", 240),
			PortId:     "Eth1/1=corral.dev/pool:prod",
			VlanId:     7,
		}
		if _, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: withNeighbours(evil)}); err != nil {
			t.Fatalf("Register: %v", err)
		}
		labels := c.machine(name).GetLabels()
		for k, v := range labels {
			switch k {
			case inventory.LabelSwitch, inventory.LabelSwitchPort, inventory.LabelSwitchVLAN:
			default:
				if before.GetLabels()[k] != v {
					t.Errorf("label %s=%q was not there before the report", k, v)
				}
			}
		}
		for _, k := range []string{inventory.LabelSwitch, inventory.LabelSwitchPort} {
			if v := labels[k]; strings.ContainsAny(v, "=,/: ") || len(v) > 63 {
				t.Errorf("%s = %q: not a label value", k, v)
			}
		}
		if labels[inventory.LabelSwitchVLAN] != "7" {
			t.Errorf("%s = %q, want 7", inventory.LabelSwitchVLAN, labels[inventory.LabelSwitchVLAN])
		}
	})

	t.Run("describe prints it escaped", func(t *testing.T) {
		conf := filepath.Join(t.TempDir(), "admin.conf")
		if err := c.cc.Write(conf); err != nil {
			t.Fatal(err)
		}
		// A description as the agent sends one it had to escape (the
		// appliance refuses raw controls, above): printed as stored.
		desc := `uplink \x9b2J`
		if _, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: withNeighbours(&inventoryv1.Facts_LldpNeighbor{ChassisId: "aa:bb:cc:00:00:04", PortId: "Ethernet9", PortDescription: desc, SystemName: "tor-3"})}); err != nil {
			t.Fatalf("Register: %v", err)
		}
		out, err := exec.Command(filepath.Join(binDir, "corral"), "--config", conf, "describe", "machine", name).CombinedOutput()
		if err != nil {
			t.Fatalf("corral describe machine: %v\n%s", err, out)
		}
		assertNoRaw(t, "corral describe machine", string(out))
		if !strings.Contains(string(out), "tor-3") || !strings.Contains(string(out), "Ethernet9") || !strings.Contains(string(out), desc) {
			t.Errorf("describe does not name the neighbour:\n%s", out)
		}
	})
}
