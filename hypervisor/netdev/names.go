// Package netdev owns the node's virtual network plumbing: one Linux bridge
// per Network, an optional 802.1Q sub-interface of the configured uplink
// enslaved to it (the Network's VLAN), and one persistent tap per VM NIC,
// all created and removed through netlink (github.com/vishvananda/netlink),
// optionally inside a given network namespace.
//
// Link names are derived, stable and at most 15 characters: a two-letter
// kind prefix ("cb" bridge, "cv" VLAN, "ct" tap), up to five characters of
// the sanitised resource name and eight hex digits of a SHA-256 of the full
// key (fixed width, unlike n0stack's %02x). Links Corral creates carry an
// alias "corral:<kind>:<key>", and Corral deletes only links carrying its
// alias. What to create is decided by pure functions (Plan, BridgeName,
// TapName) that are unit-tested; the kernel calls are in Manager.
//
// A node uplink may be a bond (ApplyBond: active-backup or 802.3ad over
// 2-8 NICs, validated first; alias "corral:bond:<slaves>").
//
// It imports only the standard library, netlink/netns, internal/apierr and
// hypervisor/internal.
package netdev

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/internal/apierr"
)

// MaxNameLen is the kernel's IFNAMSIZ-1.
const MaxNameLen = 15

// Alias prefixes marking links Corral owns.
const (
	aliasBridge = "corral:bridge:"
	aliasVLAN   = "corral:vlan:"
	aliasTap    = "corral:tap:"
)

func derive(prefix, short, key string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range strings.ToLower(short) {
		if b.Len() == len(prefix)+5 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	h := sha256.Sum256([]byte(key))
	b.WriteString(hex.EncodeToString(h[:4]))
	return b.String()
}

// BridgeName is the bridge of Network network.
func BridgeName(network string) string { return derive("cb", network, "bridge/"+network) }

// VLANName is the 802.1Q sub-interface of uplink for vlan.
func VLANName(uplink string, vlan uint16) string {
	return derive("cv", strconv.Itoa(int(vlan)), "vlan/"+uplink+"/"+strconv.Itoa(int(vlan)))
}

// TapName is the tap of NIC index of VM vm.
func TapName(vm string, index int) string {
	return derive("ct", vm, "tap/"+vm+"/"+strconv.Itoa(index))
}

// Network is what a node needs to know to wire one Network.
type Network struct {
	Name string
	// VLAN is the 802.1Q id (1-4094), 0 for none.
	VLAN uint16
	// GatewayCIDR, when set ("10.0.0.1/24"), is assigned to the bridge so
	// the node routes for the Network (n0stack's behaviour).
	GatewayCIDR string
}

// Plan is the links one Network needs on a node.
type Plan struct {
	Bridge string
	// VLANLink is empty for a host-local bridge.
	VLANLink   string
	VLANParent string
	VLANID     uint16
	// Note explains a choice worth logging (VLAN requested but no uplink).
	Note string
}

// PlanNetwork decides the links for n given the node's uplink ("" for
// none). Without an uplink every Network is a host-local bridge, VLAN or
// not (with a Note); with one, a Network with a VLAN gets a sub-interface
// of the uplink on its bridge and a Network without one stays host-local
// (the uplink itself is never enslaved).
func PlanNetwork(n Network, uplink string) (Plan, error) {
	if err := safename.Check("network", n.Name); err != nil {
		return Plan{}, err
	}
	if n.VLAN > 4094 {
		return Plan{}, apierr.Invalidf("network %q: vlan %d out of range 1-4094", n.Name, n.VLAN)
	}
	if uplink != "" && (len(uplink) > MaxNameLen || strings.ContainsAny(uplink, "/ \t\n")) {
		return Plan{}, apierr.Invalidf("uplink %q is not an interface name", uplink)
	}
	p := Plan{Bridge: BridgeName(n.Name)}
	switch {
	case n.VLAN == 0:
	case uplink == "":
		p.Note = "vlan requested but the node has no uplink: host-local bridge"
	default:
		p.VLANLink = VLANName(uplink, n.VLAN)
		p.VLANParent = uplink
		p.VLANID = n.VLAN
	}
	return p, nil
}
