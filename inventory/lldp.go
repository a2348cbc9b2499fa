package inventory

import (
	"cmp"
	"strconv"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// The labels Config.LLDPLabels keeps from a machine's LLDP neighbours
// (docs/operator-guide.md, "LLDP neighbours").
const (
	LabelSwitch     = "corral.dev/switch"      // the switch's system name, else its chassis ID
	LabelSwitchPort = "corral.dev/switch-port" // the port ID on that switch
	LabelSwitchVLAN = "corral.dev/switch-vlan" // the port's VLAN ID, when sent
)

// MaxLLDPNeighbors bounds the LLDP neighbours a report may list per NIC
// (the agent keeps to the same bound, agent/facts).
const MaxLLDPNeighbors = 4

// checkLLDP refuses a report listing more than MaxLLDPNeighbors
// neighbours on one NIC.
func checkLLDP(f *inventoryv1.Facts) error {
	for i, n := range f.GetNics() {
		if len(n.GetLldpNeighbors()) > MaxLLDPNeighbors {
			return reportErr(RefusedInvalid, "nics[%d] lists %d LLDP neighbours, at most %d", i, len(n.GetLldpNeighbors()), MaxLLDPNeighbors)
		}
	}
	return nil
}

// bootNeighbor is the LLDP neighbour that places the machine: the first
// one heard on the NIC with the boot MAC, else the first on any NIC (in
// the report's order); nil when none was heard.
func bootNeighbor(f *inventoryv1.Facts, bootMAC string) *inventoryv1.Facts_LldpNeighbor {
	var first *inventoryv1.Facts_LldpNeighbor
	for _, n := range f.GetNics() {
		if len(n.GetLldpNeighbors()) == 0 {
			continue
		}
		if mac, err := NormalizeMAC(n.GetMac()); err == nil && mac == bootMAC {
			return n.GetLldpNeighbors()[0]
		}
		if first == nil {
			first = n.GetLldpNeighbors()[0]
		}
	}
	return first
}

// applyLLDPLabels sets m's switch labels from the neighbour its report
// heard (bootNeighbor), as label values: a character a label may not
// hold becomes '-', and a value that cannot be made one (empty, all
// punctuation) leaves its label as it was. A report without a neighbour
// changes nothing: the labels say where the machine was last heard.
// It reports whether a label changed.
func applyLLDPLabels(m *inventoryv1.Machine, bootMAC string) bool {
	n := bootNeighbor(m.GetFacts(), bootMAC)
	if n == nil {
		return false
	}
	set := map[string]string{
		LabelSwitch:     labelValue(cmp.Or(n.GetSystemName(), n.GetChassisId())),
		LabelSwitchPort: labelValue(n.GetPortId()),
	}
	if v := n.GetVlanId(); v != 0 {
		set[LabelSwitchVLAN] = strconv.FormatUint(uint64(v), 10)
	}
	changed := false
	for k, v := range set {
		if v == "" || m.GetLabels()[k] == v {
			continue
		}
		if _, had := m.GetLabels()[k]; !had && len(m.GetLabels()) >= MaxLabels {
			continue
		}
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels[k] = v
		changed = true
	}
	return changed
}

// labelValue makes s a label value (checkLabelValue): characters other
// than letters, digits, '.', '_' and '-' become '-', the ends are
// trimmed to a letter or digit, and the result is cut to
// MaxLabelValueBytes. "Ethernet1/12" becomes "Ethernet1-12".
func labelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			b[i] = '-'
		}
	}
	trim := func(s string) string {
		return strings.TrimFunc(s, func(r rune) bool { return r == '.' || r == '_' || r == '-' })
	}
	out := trim(string(b))
	if len(out) > MaxLabelValueBytes {
		out = trim(out[:MaxLabelValueBytes])
	}
	return out
}
