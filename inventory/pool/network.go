package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/structpb"
)

func newNetwork() *poolv1.Network { return &poolv1.Network{} }

// ListNetworks returns every network in name order (empty slice when none).
func (p *Pool) ListNetworks(ctx context.Context) ([]*poolv1.Network, error) {
	return record.List(ctx, p.cfg.Store, networkPrefix, newNetwork)
}

// GetNetwork returns one network.
func (p *Pool) GetNetwork(ctx context.Context, name string) (*poolv1.Network, error) {
	if err := CheckName("network name", name); err != nil {
		return nil, err
	}
	n := newNetwork()
	if _, err := record.Get(ctx, p.cfg.Store, networkPrefix+name, n); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFoundf("network %q", name)
		}
		return nil, err
	}
	return n, nil
}

// netSpec is a validated ApplyNetworkRequest.
type netSpec struct {
	v4, v6   netip.Prefix
	gw4, gw6 netip.Addr
	dns      []string
	vlan     uint32
	hasV4    bool
	hasV6    bool
}

func parseNetSpec(req *poolv1.ApplyNetworkRequest) (netSpec, error) {
	var s netSpec
	name := req.GetName()
	if req.GetIpv4Cidr() == "" && req.GetIpv6Cidr() == "" {
		return s, invalidf("network %q: at least one of ipv4_cidr and ipv6_cidr is required", name)
	}
	if c := req.GetIpv4Cidr(); c != "" {
		pfx, err := netip.ParsePrefix(c)
		if err != nil || !pfx.Addr().Is4() {
			return s, invalidf("network %q: ipv4_cidr %q is not an IPv4 CIDR such as 10.0.0.0/24", name, c)
		}
		if pfx.Masked() != pfx {
			return s, invalidf("network %q: ipv4_cidr %q has host bits set (did you mean %s?)", name, c, pfx.Masked())
		}
		if pfx.Bits() > 30 {
			return s, invalidf("network %q: ipv4_cidr %q is too small: need at least /30", name, c)
		}
		s.v4, s.hasV4 = pfx, true
	}
	if c := req.GetIpv6Cidr(); c != "" {
		pfx, err := netip.ParsePrefix(c)
		if err != nil || !pfx.Addr().Is6() || pfx.Addr().Is4In6() {
			return s, invalidf("network %q: ipv6_cidr %q is not an IPv6 CIDR such as fd00:1::/64", name, c)
		}
		if pfx.Masked() != pfx {
			return s, invalidf("network %q: ipv6_cidr %q has host bits set (did you mean %s?)", name, c, pfx.Masked())
		}
		if pfx.Bits() > 126 {
			return s, invalidf("network %q: ipv6_cidr %q is too small: need at least /126", name, c)
		}
		s.v6, s.hasV6 = pfx, true
	}
	if g := req.GetIpv4Gateway(); g != "" {
		if !s.hasV4 {
			return s, invalidf("network %q: ipv4_gateway without ipv4_cidr", name)
		}
		a, err := parseHost4(s.v4, g)
		if err != nil {
			return s, invalidf("network %q: ipv4_gateway: %v", name, err)
		}
		s.gw4 = a
	}
	if g := req.GetIpv6Gateway(); g != "" {
		if !s.hasV6 {
			return s, invalidf("network %q: ipv6_gateway without ipv6_cidr", name)
		}
		a, err := parseHost6(s.v6, g)
		if err != nil {
			return s, invalidf("network %q: ipv6_gateway: %v", name, err)
		}
		s.gw6 = a
	}
	for _, d := range req.GetDnsServers() {
		a, err := netip.ParseAddr(d)
		if err != nil || a.Zone() != "" {
			return s, invalidf("network %q: dns server %q is not an IP address (without a zone)", name, d)
		}
		s.dns = append(s.dns, a.String())
	}
	s.vlan = req.GetVlanId()
	if v, ok := req.GetAnnotations()[AnnotationVLANID]; ok {
		id, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return s, invalidf("network %q: annotation %s=%q is not a number", name, AnnotationVLANID, v)
		}
		if s.vlan != 0 && uint32(id) != s.vlan {
			return s, invalidf("network %q: vlan_id %d and annotation %s=%q disagree", name, s.vlan, AnnotationVLANID, v)
		}
		s.vlan = uint32(id)
	}
	if s.vlan > 4094 {
		return s, invalidf("network %q: vlan_id %d out of range 0-4094", name, s.vlan)
	}
	return s, nil
}

// parseHost4 parses a host address inside pfx that is neither the network
// nor the broadcast address.
func parseHost4(pfx netip.Prefix, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("%q is not an IPv4 address", s)
	}
	if !pfx.Contains(a) {
		return netip.Addr{}, fmt.Errorf("%s is outside %s", a, pfx)
	}
	if a == pfx.Addr() {
		return netip.Addr{}, fmt.Errorf("%s is the network address of %s", a, pfx)
	}
	if a == lastAddr(pfx) {
		return netip.Addr{}, fmt.Errorf("%s is the broadcast address of %s", a, pfx)
	}
	return a, nil
}

func parseHost6(pfx netip.Prefix, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%q is not an IPv6 address", s)
	}
	a = a.WithZone("")
	if !pfx.Contains(a) {
		return netip.Addr{}, fmt.Errorf("%s is outside %s", a, pfx)
	}
	if a == pfx.Addr() {
		return netip.Addr{}, fmt.Errorf("%s is the subnet-router anycast address of %s", a, pfx)
	}
	return a, nil
}

func lastAddr(pfx netip.Prefix) netip.Addr {
	b := pfx.Addr().AsSlice()
	bits := pfx.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// ApplyNetwork creates or updates a network. A network's CIDRs cannot change
// once set (addresses are handed out from them), and they may not overlap
// another network's. Reservations are kept.
func (p *Pool) ApplyNetwork(ctx context.Context, req *poolv1.ApplyNetworkRequest) (*poolv1.Network, error) {
	name := req.GetName()
	if err := CheckName("network name", name); err != nil {
		return nil, err
	}
	if err := checkMeta("annotation", req.GetAnnotations()); err != nil {
		return nil, err
	}
	if err := checkMeta("label", req.GetLabels()); err != nil {
		return nil, err
	}
	spec, err := parseNetSpec(req)
	if err != nil {
		return nil, err
	}
	// Refuse a change to an existing network before claiming anything, so
	// that a refused call writes nothing; checkChange runs again under the
	// CAS below in case the network changed meanwhile.
	if cur, err := p.GetNetwork(ctx, name); err == nil {
		if err := checkChange(cur, spec); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, apierr.ErrNotFound) {
		return nil, err
	}
	// Claim the CIDRs in the network index first: the index is the one
	// record every network writer CASes on, which makes the overlap check
	// safe against a concurrent ApplyNetwork of another name.
	if err := p.claimCIDRs(ctx, name, spec); err != nil {
		return nil, err
	}
	return record.Mutate(ctx, p.cfg.Store, networkPrefix+name, newNetwork, func(n *poolv1.Network, exists bool) (bool, error) {
		if exists {
			if err := checkChange(n, spec); err != nil {
				return false, err
			}
		}
		n.Name = name
		n.Annotations = maps.Clone(req.GetAnnotations())
		n.Labels = maps.Clone(req.GetLabels())
		n.Ipv4Cidr, n.Ipv6Cidr = "", ""
		if spec.hasV4 {
			n.Ipv4Cidr = spec.v4.String()
		}
		if spec.hasV6 {
			n.Ipv6Cidr = spec.v6.String()
		}
		n.Domain = req.GetDomain()
		n.Ipv4Gateway, n.Ipv6Gateway = "", ""
		if spec.gw4.IsValid() {
			n.Ipv4Gateway = spec.gw4.String()
		}
		if spec.gw6.IsValid() {
			n.Ipv6Gateway = spec.gw6.String()
		}
		n.DnsServers = spec.dns
		n.VlanId = spec.vlan
		n.State = poolv1.Network_AVAILABLE
		return false, nil
	})
}

// checkChange refuses applying spec to the existing network n: its CIDRs
// cannot change (addresses were handed out from them; adding a family that
// was empty is allowed), and a new gateway may not be an address an
// interface already holds.
func checkChange(n *poolv1.Network, spec netSpec) error {
	name := n.GetName()
	if !sameCIDR(n.GetIpv4Cidr(), spec.hasV4, spec.v4) {
		return preconditionf("network %q: ipv4_cidr cannot change from %s to %q", name, n.GetIpv4Cidr(), prefixString(spec.hasV4, spec.v4))
	}
	if !sameCIDR(n.GetIpv6Cidr(), spec.hasV6, spec.v6) {
		return preconditionf("network %q: ipv6_cidr cannot change from %s to %q", name, n.GetIpv6Cidr(), prefixString(spec.hasV6, spec.v6))
	}
	for iface, ni := range n.GetReservedNetworkInterfaces() {
		if a, err := netip.ParseAddr(ni.GetIpv4Address()); err == nil && spec.gw4.IsValid() && a == spec.gw4 {
			return preconditionf("network %q: ipv4_gateway %s is reserved by interface %q", name, spec.gw4, iface)
		}
		if a, err := netip.ParseAddr(ni.GetIpv6Address()); err == nil && spec.gw6.IsValid() && a == spec.gw6 {
			return preconditionf("network %q: ipv6_gateway %s is reserved by interface %q", name, spec.gw6, iface)
		}
	}
	return nil
}

// sameCIDR reports whether a stored CIDR (possibly written before CIDRs
// were stored canonically) allows the requested one: an empty stored CIDR
// allows anything, otherwise the prefixes must be equal.
func sameCIDR(stored string, has bool, want netip.Prefix) bool {
	if stored == "" {
		return true
	}
	old, err := netip.ParsePrefix(stored)
	return err == nil && has && old.Masked() == want
}

func prefixString(has bool, p netip.Prefix) string {
	if !has {
		return ""
	}
	return p.String()
}

// The network index is one record: name -> {ipv4, ipv6, claimed}. It is a
// structpb.Struct so that it needs no schema of its own.
func newIndex() *structpb.Struct { return &structpb.Struct{Fields: map[string]*structpb.Value{}} }

// claimStale is how long an index claim without its network record is
// honoured; after that it is taken to be left by a writer that died between
// claiming and writing the network.
const claimStale = time.Minute

func (p *Pool) claimCIDRs(ctx context.Context, name string, spec netSpec) error {
	others, err := p.ListNetworks(ctx)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, n := range others {
		present[n.GetName()] = true
	}
	// Check the network records too, not only the index: an index entry
	// can be lost (a DeleteNetwork racing a re-create of the same name
	// removes the new claim), and the record still holds its range.
	for _, o := range others {
		if o.GetName() == name {
			continue
		}
		if err := overlaps(name, spec, o.GetName(), o.GetIpv4Cidr(), o.GetIpv6Cidr()); err != nil {
			return err
		}
	}
	now := p.cfg.Now()
	_, err = record.Mutate(ctx, p.cfg.Store, networkIndex, newIndex, func(idx *structpb.Struct, _ bool) (bool, error) {
		if idx.Fields == nil {
			idx.Fields = map[string]*structpb.Value{}
		}
		for other, v := range idx.GetFields() {
			if other == name {
				continue
			}
			f := v.GetStructValue().GetFields()
			if !present[other] {
				claimed, _ := time.Parse(time.RFC3339Nano, f["claimed"].GetStringValue())
				if now.Sub(claimed) > claimStale {
					delete(idx.Fields, other)
					continue
				}
			}
			if err := overlaps(name, spec, other, f["ipv4"].GetStringValue(), f["ipv6"].GetStringValue()); err != nil {
				return false, err
			}
		}
		entry := map[string]any{"claimed": now.UTC().Format(time.RFC3339Nano), "ipv4": "", "ipv6": ""}
		if spec.hasV4 {
			entry["ipv4"] = spec.v4.String()
		}
		if spec.hasV6 {
			entry["ipv6"] = spec.v6.String()
		}
		if old, ok := idx.Fields[name]; ok {
			f := old.GetStructValue().GetFields()
			// Keep CIDRs already claimed for an existing network; the network
			// record refuses the change with a clear error.
			if present[name] {
				if c := f["ipv4"].GetStringValue(); c != "" {
					entry["ipv4"] = c
				}
				if c := f["ipv6"].GetStringValue(); c != "" {
					entry["ipv6"] = c
				}
			}
		}
		v, err := structpb.NewValue(entry)
		if err != nil {
			return false, err
		}
		idx.Fields[name] = v
		return false, nil
	})
	return err
}

// overlaps refuses spec when it overlaps another network's CIDRs.
func overlaps(name string, spec netSpec, other, v4, v6 string) error {
	if o, err := netip.ParsePrefix(v4); err == nil && spec.hasV4 && o.Overlaps(spec.v4) {
		return preconditionf("network %q: ipv4_cidr %s overlaps network %q (%s)", name, spec.v4, other, o)
	}
	if o, err := netip.ParsePrefix(v6); err == nil && spec.hasV6 && o.Overlaps(spec.v6) {
		return preconditionf("network %q: ipv6_cidr %s overlaps network %q (%s)", name, spec.v6, other, o)
	}
	return nil
}

func (p *Pool) unclaimCIDRs(ctx context.Context, name string) error {
	_, err := record.Mutate(ctx, p.cfg.Store, networkIndex, newIndex, func(idx *structpb.Struct, exists bool) (bool, error) {
		delete(idx.Fields, name)
		return false, nil
	})
	return err
}

// DeleteNetwork removes a network. It is refused while interfaces that lack
// the disable-deletion-lock annotation are reserved on it.
func (p *Pool) DeleteNetwork(ctx context.Context, name string) error {
	if err := CheckName("network name", name); err != nil {
		return err
	}
	_, err := record.Mutate(ctx, p.cfg.Store, networkPrefix+name, newNetwork, func(n *poolv1.Network, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("network %q", name)
		}
		var held []string
		for k, ni := range n.GetReservedNetworkInterfaces() {
			if _, ok := ni.GetAnnotations()[AnnotationNetworkDisableDeletionLock]; !ok {
				held = append(held, k)
			}
		}
		if len(held) > 0 {
			sort.Strings(held)
			return false, preconditionf("network %q still holds %d interface reservation(s): %s", name, len(held), strings.Join(held, ", "))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	return p.unclaimCIDRs(ctx, name)
}

// ReserveNetworkInterface books an interface on a network. Missing
// addresses are allocated: IPv4 as the lowest free host address (skipping
// the network, broadcast and gateway addresses), IPv6 from the MAC (EUI-64)
// on a /64 or larger, else the lowest free address; a missing MAC is
// derived from the network and interface names, re-derived on collision.
func (p *Pool) ReserveNetworkInterface(ctx context.Context, req *poolv1.ReserveNetworkInterfaceRequest) (*poolv1.Network, error) {
	netName, iface := req.GetNetworkName(), req.GetNetworkInterfaceName()
	if err := CheckName("network_name", netName); err != nil {
		return nil, err
	}
	if err := CheckName("network_interface_name", iface); err != nil {
		return nil, err
	}
	if err := checkMeta("annotation", req.GetAnnotations()); err != nil {
		return nil, err
	}
	var mac net.HardwareAddr
	if s := req.GetHardwareAddress(); s != "" {
		m, err := net.ParseMAC(s)
		if err != nil || len(m) != 6 {
			return nil, invalidf("hardware_address %q is not a 6-byte MAC address", s)
		}
		if m[0]&1 == 1 {
			return nil, invalidf("hardware_address %s is a multicast address", m)
		}
		if binary.BigEndian.Uint32(m[:4]) == 0 && binary.BigEndian.Uint16(m[4:]) == 0 {
			return nil, invalidf("hardware_address %s is all zeros", m)
		}
		mac = m
	}
	return record.Mutate(ctx, p.cfg.Store, networkPrefix+netName, newNetwork, func(n *poolv1.Network, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("network %q", netName)
		}
		if _, ok := n.GetReservedNetworkInterfaces()[iface]; ok {
			return false, existsf("interface %q is already reserved on network %q", iface, netName)
		}
		ni, err := allocate(n, iface, req, mac)
		if err != nil {
			return false, err
		}
		if n.ReservedNetworkInterfaces == nil {
			n.ReservedNetworkInterfaces = map[string]*poolv1.NetworkInterface{}
		}
		n.ReservedNetworkInterfaces[iface] = ni
		return false, nil
	})
}

// allocate computes the interface's addresses against the network's
// current reservations.
func allocate(n *poolv1.Network, iface string, req *poolv1.ReserveNetworkInterfaceRequest, mac net.HardwareAddr) (*poolv1.NetworkInterface, error) {
	usedMAC := map[string]string{}
	used4 := map[netip.Addr]string{}
	used6 := map[netip.Addr]string{}
	for k, r := range n.GetReservedNetworkInterfaces() {
		if r.GetHardwareAddress() != "" {
			usedMAC[strings.ToLower(r.GetHardwareAddress())] = k
		}
		if a, err := netip.ParseAddr(r.GetIpv4Address()); err == nil {
			used4[a] = k
		}
		if a, err := netip.ParseAddr(r.GetIpv6Address()); err == nil {
			used6[a] = k
		}
	}
	ni := &poolv1.NetworkInterface{Annotations: maps.Clone(req.GetAnnotations())}

	// MAC.
	if mac != nil {
		if other, ok := usedMAC[mac.String()]; ok {
			return nil, existsf("hardware_address %s is already used by interface %q on network %q", mac, other, n.GetName())
		}
	} else {
		for i := 0; ; i++ {
			mac = generateMAC(n.GetName(), iface, i)
			if _, ok := usedMAC[mac.String()]; !ok {
				break
			}
			if i > 1000 {
				return nil, exhaustedf("network %q: could not generate a free MAC address", n.GetName())
			}
		}
	}
	ni.HardwareAddress = mac.String()

	// IPv4.
	var v4 netip.Prefix
	if c := n.GetIpv4Cidr(); c != "" {
		v4, _ = netip.ParsePrefix(c)
	}
	gw4, _ := netip.ParseAddr(n.GetIpv4Gateway())
	if s := req.GetIpv4Address(); s != "" {
		if !v4.IsValid() {
			return nil, invalidf("network %q has no ipv4_cidr, so ipv4_address %q cannot be reserved", n.GetName(), s)
		}
		a, err := parseHost4(v4, s)
		if err != nil {
			return nil, invalidf("network %q: ipv4_address: %v", n.GetName(), err)
		}
		if a == gw4 {
			return nil, existsf("network %q: ipv4_address %s is the network's gateway", n.GetName(), a)
		}
		if other, ok := used4[a]; ok {
			return nil, existsf("network %q: ipv4_address %s is already reserved by interface %q", n.GetName(), a, other)
		}
		ni.Ipv4Address = a.String()
	} else if v4.IsValid() {
		a, ok := firstFree(v4, gw4, used4, true)
		if !ok {
			return nil, exhaustedf("network %q: no free IPv4 address in %s (%d reserved)", n.GetName(), v4, len(used4))
		}
		ni.Ipv4Address = a.String()
	}

	// IPv6.
	var v6 netip.Prefix
	if c := n.GetIpv6Cidr(); c != "" {
		v6, _ = netip.ParsePrefix(c)
	}
	gw6, _ := netip.ParseAddr(n.GetIpv6Gateway())
	if s := req.GetIpv6Address(); s != "" {
		if !v6.IsValid() {
			return nil, invalidf("network %q has no ipv6_cidr, so ipv6_address %q cannot be reserved", n.GetName(), s)
		}
		a, err := parseHost6(v6, s)
		if err != nil {
			return nil, invalidf("network %q: ipv6_address: %v", n.GetName(), err)
		}
		if a == gw6 {
			return nil, existsf("network %q: ipv6_address %s is the network's gateway", n.GetName(), a)
		}
		if other, ok := used6[a]; ok {
			return nil, existsf("network %q: ipv6_address %s is already reserved by interface %q", n.GetName(), a, other)
		}
		ni.Ipv6Address = a.String()
	} else if v6.IsValid() {
		a, ok := netip.Addr{}, false
		if v6.Bits() <= 64 {
			a = eui64(v6, mac)
			_, taken := used6[a]
			ok = !taken && a != gw6
		}
		if !ok {
			a, ok = firstFree(v6, gw6, used6, false)
		}
		if !ok {
			return nil, exhaustedf("network %q: no free IPv6 address in %s (%d reserved)", n.GetName(), v6, len(used6))
		}
		ni.Ipv6Address = a.String()
	}
	return ni, nil
}

// firstFree returns the lowest host address of pfx that is not the network
// address, the gateway or in used (nor, for IPv4, the broadcast address).
func firstFree(pfx netip.Prefix, gw netip.Addr, used map[netip.Addr]string, v4 bool) (netip.Addr, bool) {
	last := lastAddr(pfx)
	// Bound the walk: at most len(used)+2 addresses can be skipped.
	limit := len(used) + 3
	for a, i := pfx.Addr().Next(), 0; a.IsValid() && pfx.Contains(a) && i < limit; a, i = a.Next(), i+1 {
		if v4 && a == last {
			break
		}
		if a == gw {
			continue
		}
		if _, ok := used[a]; ok {
			continue
		}
		return a, true
	}
	return netip.Addr{}, false
}

// generateMAC derives a locally administered unicast MAC (52:54:...) from
// the network and interface names; attempt > 0 perturbs it after a
// collision.
func generateMAC(network, iface string, attempt int) net.HardwareAddr {
	key := network + "/" + iface
	if attempt > 0 {
		key += "#" + strconv.Itoa(attempt)
	}
	sum := crc32.ChecksumIEEE([]byte(key))
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(mac[2:], sum)
	return mac
}

// eui64 forms the modified EUI-64 interface identifier of mac inside pfx.
func eui64(pfx netip.Prefix, mac net.HardwareAddr) netip.Addr {
	b := pfx.Addr().As16()
	b[8] = mac[0] ^ 0x02
	b[9] = mac[1]
	b[10] = mac[2]
	b[11] = 0xff
	b[12] = 0xfe
	b[13] = mac[3]
	b[14] = mac[4]
	b[15] = mac[5]
	return netip.AddrFrom16(b)
}

// ReleaseNetworkInterface removes an interface reservation; NotFound when
// absent.
func (p *Pool) ReleaseNetworkInterface(ctx context.Context, netName, iface string) error {
	if err := CheckName("network_name", netName); err != nil {
		return err
	}
	if err := CheckName("network_interface_name", iface); err != nil {
		return err
	}
	_, err := record.Mutate(ctx, p.cfg.Store, networkPrefix+netName, newNetwork, func(n *poolv1.Network, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("network %q", netName)
		}
		if _, ok := n.GetReservedNetworkInterfaces()[iface]; !ok {
			return false, notFoundf("interface %q on network %q", iface, netName)
		}
		delete(n.ReservedNetworkInterfaces, iface)
		return false, nil
	})
	return err
}
