package lldp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/termsafe"
)

// Bounds on what one NIC's neighbours may hold.
const (
	MaxString    = 255 // bytes of one string, after escaping
	MaxNeighbors = 4   // neighbours kept per NIC
	MaxVLANNames = 16  // VLAN names kept per neighbour
	// MaxFrame is the largest frame read; LLDP frames fit in one
	// Ethernet MTU and the rest of a longer one is dropped.
	MaxFrame = 1514
)

// EtherType is LLDP's Ethernet type.
const EtherType = 0x88cc

// Multicast is the nearest-bridge group address LLDP is sent to.
var Multicast = net.HardwareAddr{0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e}

// ErrNotLLDP is returned by Decode for a frame that holds no LLDPDU.
var ErrNotLLDP = errors.New("lldp: not an LLDP frame")

// Neighbor is one LLDP neighbour as its frame described itself.
type Neighbor struct {
	ChassisID         string
	PortID            string
	PortDescription   string
	SystemName        string
	ManagementAddress string // an IP address or ""
	VLAN              uint16 // port VLAN ID; 0 when not sent
	VLANNames         []string
}

// key identifies a neighbour among a NIC's: the LLDP MSAP identifier.
func (n Neighbor) key() string { return n.ChassisID + "\x00" + n.PortID }

// Proto is n as facts.
func (n Neighbor) Proto() *inventoryv1.Facts_LldpNeighbor {
	return &inventoryv1.Facts_LldpNeighbor{
		ChassisId: n.ChassisID, PortId: n.PortID, PortDescription: n.PortDescription,
		SystemName: n.SystemName, ManagementAddress: n.ManagementAddress,
		VlanId: uint32(n.VLAN), VlanNames: n.VLANNames,
	}
}

// Decode reads an Ethernet frame holding an LLDPDU. It never panics on
// malformed input: a frame gopacket cannot read returns an error, and
// every string is bounded and escaped. A frame without the mandatory
// chassis and port IDs is refused.
func Decode(frame []byte) (Neighbor, error) {
	if len(frame) > MaxFrame {
		frame = frame[:MaxFrame]
	}
	// Only the LLDPDU goes to gopacket: its Ethernet decoder would hand
	// any other ethertype to that protocol's decoder.
	if len(frame) < 14 || binary.BigEndian.Uint16(frame[12:14]) != EtherType {
		return Neighbor{}, ErrNotLLDP
	}
	pkt := gopacket.NewPacket(frame[14:], layers.LayerTypeLinkLayerDiscovery, gopacket.DecodeOptions{NoCopy: true})
	du, _ := pkt.Layer(layers.LayerTypeLinkLayerDiscovery).(*layers.LinkLayerDiscovery)
	if du == nil {
		if f := pkt.ErrorLayer(); f != nil {
			return Neighbor{}, fmt.Errorf("lldp: %w", f.Error())
		}
		return Neighbor{}, errors.New("lldp: no LLDPDU")
	}
	n := Neighbor{
		ChassisID: chassisID(du.ChassisID),
		PortID:    portID(du.PortID),
	}
	if n.ChassisID == "" || n.PortID == "" {
		return Neighbor{}, errors.New("lldp: frame without a chassis or port ID")
	}
	info, _ := pkt.Layer(layers.LayerTypeLinkLayerDiscoveryInfo).(*layers.LinkLayerDiscoveryInfo)
	if info == nil {
		return n, nil
	}
	n.PortDescription = clean([]byte(info.PortDescription))
	n.SystemName = clean([]byte(info.SysName))
	n.ManagementAddress = mgmtAddress(info.MgmtAddress)
	n.VLAN, n.VLANNames = vlans(info)
	return n, nil
}

// chassisID renders a chassis ID by its subtype: a MAC or network address
// as such, the rest (component, interface alias or name, local) as text.
func chassisID(c layers.LLDPChassisID) string {
	switch c.Subtype {
	case layers.LLDPChassisIDSubTypeMACAddr:
		return macOrText(c.ID)
	case layers.LLDPChassisIDSubTypeNetworkAddr:
		return networkAddr(c.ID)
	default:
		return clean(c.ID)
	}
}

// portID renders a port ID by its subtype, as chassisID does.
func portID(p layers.LLDPPortID) string {
	switch p.Subtype {
	case layers.LLDPPortIDSubtypeMACAddr:
		return macOrText(p.ID)
	case layers.LLDPPortIDSubtypeNetworkAddr:
		return networkAddr(p.ID)
	default:
		return clean(p.ID)
	}
}

func macOrText(b []byte) string {
	if len(b) == 6 {
		return net.HardwareAddr(b).String()
	}
	return clean(b)
}

// networkAddr is an IANA address family byte and an address.
func networkAddr(b []byte) string {
	if len(b) > 1 {
		if a, ok := netip.AddrFromSlice(b[1:]); ok {
			return a.String()
		}
	}
	return clean(b)
}

func mgmtAddress(m layers.LLDPMgmtAddress) string {
	switch m.Subtype {
	case layers.IANAAddressFamilyIPV4, layers.IANAAddressFamilyIPV6:
		if a, ok := netip.AddrFromSlice(m.Address); ok {
			return a.String()
		}
	case layers.IANAAddressFamily802:
		if len(m.Address) == 6 {
			return net.HardwareAddr(m.Address).String()
		}
	default:
	}
	return ""
}

// vlans reads the IEEE 802.1 organisationally specific TLVs: the port
// VLAN ID and the VLAN names. A malformed one leaves both empty.
func vlans(info *layers.LinkLayerDiscoveryInfo) (uint16, []string) {
	d, err := decode8021(info)
	if err != nil {
		return 0, nil
	}
	var names []string
	for _, v := range d.VLANNames {
		if len(names) == MaxVLANNames {
			break
		}
		names = append(names, clean([]byte(strconv.Itoa(int(v.ID))+" "+v.Name)))
	}
	return d.PVID, names
}

// decode8021 is gopacket's Decode8021 with its panics (a library decoding
// attacker-controlled bytes) turned into an error.
func decode8021(info *layers.LinkLayerDiscoveryInfo) (d layers.LLDPInfo8021, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("lldp: malformed IEEE 802.1 TLV: %v", r)
		}
	}()
	return info.Decode8021()
}

// clean makes b a printable string of at most MaxString bytes: valid
// UTF-8, trailing NULs and spaces dropped, control characters escaped,
// cut on a rune boundary.
func clean(b []byte) string {
	return termsafe.Bounded(strings.TrimRight(string(b), "\x00 "), MaxString)
}

// Attach puts the neighbours heard on each NIC into f's NIC of that
// name (at most MaxNeighbors each); neighbours of a NIC f does not list
// are dropped. It accepts a nil f.
func Attach(f *inventoryv1.Facts, heard map[string][]Neighbor) {
	for _, nic := range f.GetNics() {
		list := heard[nic.GetName()]
		nic.LldpNeighbors = nil
		for _, n := range list[:min(len(list), MaxNeighbors)] {
			nic.LldpNeighbors = append(nic.LldpNeighbors, n.Proto())
		}
	}
}
