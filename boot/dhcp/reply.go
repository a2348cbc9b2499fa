package dhcp

import (
	"net"
	"net/netip"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func ip4(a netip.Addr) net.IP {
	if !a.IsValid() {
		return net.IPv4zero.To4()
	}
	b := a.As4()
	return net.IP(b[:])
}

// messageType is m.MessageType() without its allocation (the library
// decodes the one byte through a new buffer on every call, and a packet
// asks ~4 times): option 53 of exactly one byte, else MessageTypeNone.
func messageType(m *dhcpv4.DHCPv4) dhcpv4.MessageType {
	if v := m.Options.Get(dhcpv4.OptionDHCPMessageType); len(v) == 1 {
		return dhcpv4.MessageType(v[0])
	}
	return dhcpv4.MessageTypeNone
}

// optAddr is addrOf(dhcpv4.GetIP(code, m.Options)) without its
// allocations: an option of exactly four bytes, not 0.0.0.0.
func optAddr(m *dhcpv4.DHCPv4, code dhcpv4.OptionCode) netip.Addr {
	v := m.Options.Get(code)
	if len(v) != 4 {
		return netip.Addr{}
	}
	if a := netip.AddrFrom4([4]byte(v)); !a.IsUnspecified() {
		return a
	}
	return netip.Addr{}
}

func addrOf(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || ip.To4() == nil || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// relayOf is the relay's address (giaddr) as the lease records it, "" for
// a request that was not relayed.
func relayOf(m *dhcpv4.DHCPv4) string {
	if g := addrOf(m.GatewayIPAddr); g.IsValid() {
		return g.String()
	}
	return ""
}

// clientID is the client identifier (option 61) as a string, "" if none.
func clientID(m *dhcpv4.DHCPv4) string {
	return string(m.Options.Get(dhcpv4.OptionClientIdentifier))
}

// destination is where a reply goes: to the relay (giaddr:67), to the
// client's address for renewals/informs (ciaddr:68), else broadcast.
func destination(req *dhcpv4.DHCPv4) *net.UDPAddr {
	if g := addrOf(req.GatewayIPAddr); g.IsValid() {
		return &net.UDPAddr{IP: ip4(g), Port: dhcpv4.ServerPort}
	}
	if c := addrOf(req.ClientIPAddr); c.IsValid() {
		return &net.UDPAddr{IP: ip4(c), Port: dhcpv4.ClientPort}
	}
	return broadcast
}

// broadcast is where answers to clients without an address go; shared by
// the replies (never modified).
var broadcast = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}

// reply starts the answer to req: what dhcpv4.NewReplyFromRequest with
// the message type and our server identifier makes (the request's xid,
// flags, chaddr and giaddr, its options 61 and 82 copied), built directly:
// without New's random transaction ID (a getrandom per reply, overwritten
// at once), a modifier closure per field, or a copy of the MAC. Options
// are set as the library's encoders would write them.
func (s *Server) reply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType) *dhcpv4.DHCPv4 {
	op := dhcpv4.OpcodeBootRequest
	if req.OpCode == dhcpv4.OpcodeBootRequest {
		op = dhcpv4.OpcodeBootReply
	}
	d := replies.Get().(*dhcpv4.DHCPv4)
	*d = dhcpv4.DHCPv4{OpCode: op, HWType: req.HWType, ClientHWAddr: req.ClientHWAddr, TransactionID: req.TransactionID,
		Flags: req.Flags, ClientIPAddr: net.IPv4zero, YourIPAddr: net.IPv4zero, ServerIPAddr: net.IPv4zero,
		GatewayIPAddr: req.GatewayIPAddr, Options: d.Options}
	for _, c := range []dhcpv4.OptionCode{dhcpv4.OptionRelayAgentInformation, dhcpv4.OptionClientIdentifier} {
		if v := req.Options.Get(c); v != nil {
			d.Options[c.Code()] = v
		}
	}
	d.Options[dhcpv4.OptionDHCPMessageType.Code()] = msgTypes[mt][:]
	d.Options[dhcpv4.OptionServerIdentifier.Code()] = s.sid
	return d
}

// replies are reply structs handle has written and given back (recycle),
// each with its emptied options map: a reply and its map were ~0.5 KB per
// packet. Replies Respond returns to other callers are never given back.
var replies = sync.Pool{New: func() any { return &dhcpv4.DHCPv4{Options: make(dhcpv4.Options, 8)} }}

// recycle gives a reply handle has written back to replies. Its fields
// refer to the request's memory and to shared option bytes: they are
// dropped, never written to.
func recycle(d *dhcpv4.DHCPv4) {
	o := d.Options
	clear(o)
	*d = dhcpv4.DHCPv4{Options: o}
	replies.Put(d)
}

// msgTypes are option 53's values, shared by the replies (read-only).
var msgTypes = func() (t [256][1]byte) {
	for i := range t {
		t[i][0] = byte(i)
	}
	return t
}()

// netOptions are a range's options 1, 3 and 6 as sent (nil: none).
type netOptions struct{ mask, routers, dns []byte }

func netOptionsOf(r Range) netOptions {
	o := netOptions{mask: net.CIDRMask(r.Subnet.Bits(), 32)}
	if len(r.Router) > 0 {
		o.routers = ipList(r.Router)
	}
	if len(r.DNS) > 0 {
		o.dns = ipList(r.DNS)
	}
	return o
}

// setNet sets the range's options: netmask, routers, DNS servers.
func (s *Server) setNet(d *dhcpv4.DHCPv4, r Range) {
	o, ok := s.netOpts[r.Subnet]
	if !ok {
		o = netOptionsOf(r)
	}
	d.Options[dhcpv4.OptionSubnetMask.Code()] = o.mask
	if o.routers != nil {
		d.Options[dhcpv4.OptionRouter.Code()] = o.routers
	}
	if o.dns != nil {
		d.Options[dhcpv4.OptionDomainNameServer.Code()] = o.dns
	}
}

// setLease sets the lease of ip in r: yiaddr, lease time and setNet's.
func (s *Server) setLease(d *dhcpv4.DHCPv4, r Range, ip netip.Addr) {
	d.YourIPAddr = ip4(ip)
	s.setNet(d, r)
	d.Options[dhcpv4.OptionIPAddressLeaseTime.Code()] = s.leaseTime
}

// ipList is addresses as options 3 and 6 carry them.
func ipList(as []netip.Addr) []byte {
	out := make([]byte, 0, 4*len(as))
	for _, a := range as {
		out = append(out, ip4(a)...)
	}
	return out
}
