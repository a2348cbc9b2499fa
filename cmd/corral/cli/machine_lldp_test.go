package cli

import (
	"bytes"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// describe machine's notes name each NIC's LLDP neighbour (switch, port,
// VLAN) after the record, with what the neighbour sent escaped.
func TestLLDPNotes(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m1", Facts: &inventoryv1.Facts{Nics: []*inventoryv1.Facts_Nic{
		{Name: "eno1", LldpNeighbors: []*inventoryv1.Facts_LldpNeighbor{{
			ChassisId: "52:54:00:12:34:56", PortId: "Ethernet1/12", PortDescription: "rack 4\x1b[2J", SystemName: "leaf-04",
			ManagementAddress: "10.0.0.2", VlanId: 42, VlanNames: []string{"42 provisioning"},
		}}},
		{Name: "eno2"},
		{Name: "eno3", LldpNeighbors: []*inventoryv1.Facts_LldpNeighbor{{ChassisId: "sw\u202e", PortId: "7"}}},
	}}}
	var out bytes.Buffer
	if err := lldpNotes(&out, m); err != nil {
		t.Fatal(err)
	}
	want := `# lldp eno1: switch leaf-04 (52:54:00:12:34:56) port Ethernet1/12 "rack 4\x1b[2J", VLAN 42, VLANs 42 provisioning, management 10.0.0.2
# lldp eno3: switch sw\u202e port 7
`
	if out.String() != want {
		t.Errorf("notes:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := lldpNotes(&out, &inventoryv1.Machine{Name: "bare"}); err != nil || out.Len() != 0 {
		t.Errorf("a machine without neighbours: %q, %v", out.String(), err)
	}
	if strings.ContainsAny(want, "\x1b\u202e") {
		t.Fatal("the test's own want holds a control character")
	}
}
