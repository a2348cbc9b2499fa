package cli

import (
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/proto"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/termsafe"
)

// lldpNotes prints, after a machine's record, one line per LLDP
// neighbour its discovery heard: the NIC, the switch, its port and the
// port's VLAN. Every value is the neighbour's word and printed escaped
// (internal/termsafe).
func lldpNotes(w io.Writer, m proto.Message) error {
	mm, ok := m.(*inventoryv1.Machine)
	if !ok {
		return nil
	}
	for _, nic := range mm.GetFacts().GetNics() {
		for _, n := range nic.GetLldpNeighbors() {
			if _, err := fmt.Fprintf(w, "# lldp %s: %s\n", termsafe.Escape(nic.GetName()), lldpNote(n)); err != nil {
				return writeErr(err)
			}
		}
	}
	return nil
}

// lldpNote renders one neighbour: "switch leaf-04 (52:54:00:12:34:56)
// port Ethernet1/12 "rack 4 uplink", VLAN 42, management 10.0.0.2".
func lldpNote(n *inventoryv1.Facts_LldpNeighbor) string {
	e := termsafe.Escape
	sw := e(n.GetChassisId())
	if name := n.GetSystemName(); name != "" {
		sw = e(name) + " (" + sw + ")"
	}
	parts := []string{"switch " + sw + " port " + e(n.GetPortId())}
	if d := n.GetPortDescription(); d != "" && d != n.GetPortId() {
		parts[0] += ` "` + e(d) + `"`
	}
	if v := n.GetVlanId(); v != 0 {
		parts = append(parts, fmt.Sprintf("VLAN %d", v))
	}
	if names := n.GetVlanNames(); len(names) > 0 {
		parts = append(parts, "VLANs "+e(strings.Join(names, ", ")))
	}
	if a := n.GetManagementAddress(); a != "" {
		parts = append(parts, "management "+e(a))
	}
	return strings.Join(parts, ", ")
}
