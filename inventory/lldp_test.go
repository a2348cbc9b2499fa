package inventory

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

func withNeighbor(f *inventoryv1.Facts, n *inventoryv1.Facts_LldpNeighbor) *inventoryv1.Facts {
	f.Nics[0].LldpNeighbors = []*inventoryv1.Facts_LldpNeighbor{n}
	return f
}

// TestRegisterLLDPLabels: with Config.LLDPLabels a report's LLDP
// neighbour sets the switch labels, as label values; a later report
// without one leaves them; without the option they are never set.
func TestRegisterLLDPLabels(t *testing.T) {
	ctx := context.Background()
	const mac = "52:54:00:00:00:01"
	leaf := &inventoryv1.Facts_LldpNeighbor{ChassisId: "52:54:00:aa:bb:cc", PortId: "Ethernet1/12", SystemName: "leaf-04.rack-4", VlanId: 42}

	inv := newInv(t, Config{LLDPLabels: true})
	m, err := inv.Register(ctx, mac, withNeighbor(facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", mac), leaf), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{LabelSwitch: "leaf-04.rack-4", LabelSwitchPort: "Ethernet1-12", LabelSwitchVLAN: "42"}
	if diff := cmp.Diff(want, m.GetLabels()); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	m, err = inv.Register(ctx, mac, facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", mac), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, m.GetLabels()); diff != "" {
		t.Errorf("a report without a neighbour changed the labels (-want +got):\n%s", diff)
	}

	off := newInv(t, Config{})
	m, err = off.Register(ctx, mac, withNeighbor(facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", mac), leaf), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.GetLabels()) != 0 {
		t.Errorf("labels %v without LLDPLabels", m.GetLabels())
	}
	if got := m.GetFacts().GetNics()[0].GetLldpNeighbors(); len(got) != 1 || got[0].GetPortId() != "Ethernet1/12" {
		t.Errorf("facts lost the neighbour: %v", got)
	}
}

func TestLLDPLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"Ethernet1/12":                       "Ethernet1-12",
		"leaf-04.rack-4":                     "leaf-04.rack-4",
		"52:54:00:aa:bb:cc":                  "52-54-00-aa-bb-cc",
		"/// ":                               "",
		"  sw 1 ":                            "sw-1",
		"gi0/1\\x1b[2J":                      "gi0-1-x1b-2J",
		"port ünïcode":                       "port---n--code",
		string(make([]byte, 100)):            "",
		"x" + string(make([]byte, 80)) + "y": "x",
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
		if got := labelValue(in); got != "" {
			if err := checkLabelValue("k", got); err != nil {
				t.Errorf("labelValue(%q) = %q: %v", in, got, err)
			}
		}
	}
}

// A report with more than MaxLLDPNeighbors neighbours on a NIC is refused.
func TestCheckLLDPNeighbours(t *testing.T) {
	f := facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", "52:54:00:00:00:01")
	for range MaxLLDPNeighbors + 1 {
		f.Nics[0].LldpNeighbors = append(f.Nics[0].LldpNeighbors, &inventoryv1.Facts_LldpNeighbor{ChassisId: "c", PortId: "p"})
	}
	var re *ReportError
	if err := (FactCaps{}).Check(f); !errors.As(err, &re) || re.Reason != RefusedInvalid {
		t.Errorf("Check = %v, want a refusal", err)
	}
	f.Nics[0].LldpNeighbors = f.Nics[0].LldpNeighbors[:MaxLLDPNeighbors]
	if err := (FactCaps{}).Check(f); err != nil {
		t.Errorf("Check(%d neighbours) = %v", MaxLLDPNeighbors, err)
	}
}
