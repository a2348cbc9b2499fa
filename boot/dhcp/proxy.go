package dhcp

import (
	"context"
	"fmt"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// setBoot applies a boot choice to a reply.
func (s *Server) setBoot(d *dhcpv4.DHCPv4, b Boot, c Client, proxy bool) {
	if b.Kind == BootNone {
		return
	}
	if b.Kind == BootTFTP {
		d.ServerIPAddr = ip4(s.cfg.ServerIP)
	}
	d.BootFileName = b.File
	if b.Echo60 != "" {
		d.Options[dhcpv4.OptionClassIdentifier.Code()] = []byte(b.Echo60)
	}
	if proxy && b.Echo60 == "PXEClient" {
		// PXE_DISCOVERY_CONTROL = 8: take the boot file from this answer,
		// no boot-server discovery.
		d.Options[dhcpv4.OptionVendorSpecificInformation.Code()] = []byte{6, 1, 8, 255}
	}
	if b.RootPath != "" {
		d.Options[dhcpv4.OptionRootPath.Code()] = []byte(b.RootPath)
	}
	if len(c.UUID) > 0 && (c.PXE || c.HTTP) {
		d.Options[dhcpv4.OptionClientMachineIdentifier.Code()] = c.UUID
	}
}

// respondProxy answers PXE clients' DISCOVERs with boot options only.
func (s *Server) respondProxy(ctx context.Context, m *dhcpv4.DHCPv4, mac string) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	if messageType(m) != dhcpv4.MessageTypeDiscover {
		if messageType(m) == dhcpv4.MessageTypeRequest && c.NetBoot() {
			if ip := optAddr(m, dhcpv4.OptionRequestedIPAddress); ip.IsValid() {
				attrs.setIP(ip)
			}
			s.eventN(mac, "request-seen", "REQUEST to the network's DHCP server (proxy mode: not ours to answer)", attrs)
		}
		return nil, nil
	}
	if !c.NetBoot() {
		return nil, nil // not a PXE client: the other server's business
	}
	recorded := s.identify(ctx, c, attrs)
	s.eventN(mac, "discover", describe("DISCOVER (proxy)", c), attrs)
	b := ChooseBoot(c, s.env)
	if !recorded {
		b = unrecorded(attrs)
	}
	if b.Kind == BootNone {
		s.eventN(mac, "no-offer", "proxy: "+b.Reason, attrs)
		return nil, nil
	}
	if b.Echo60 == "" {
		b.Echo60 = "PXEClient" // a proxy offer is only recognised with it
	}
	rep := s.reply(m, dhcpv4.MessageTypeOffer)
	s.setBoot(rep, b, c, true)
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ServerIPAddr = ip4(s.cfg.ServerIP)
	s.event(mac, "offer", fmt.Sprintf("proxy OFFER (no address), boot %s %s (%s)", b.Kind, b.File, b.Reason), bootAttrs(map[string]string{"reason": b.Reason, "proxy": "true"}, b))
	return rep, destination(m)
}

// respondPXE answers the PXE boot-server request on port 4011 (proxy
// mode, and iPXE's ProxyDHCPREQUEST in full mode): an ACK with the boot
// file, sent back to the asking port.
func (s *Server) respondPXE(m *dhcpv4.DHCPv4, mac string, peer *net.UDPAddr) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	if messageType(m) != dhcpv4.MessageTypeRequest && messageType(m) != dhcpv4.MessageTypeInform {
		s.eventN(mac, "ignored", "port 4011: "+messageType(m).String()+" is not a boot-server request", attrs)
		return nil, nil
	}
	b := ChooseBoot(c, s.env)
	if b.Kind == BootNone {
		s.eventN(mac, "no-offer", "boot server: "+b.Reason, attrs)
		return nil, nil
	}
	if b.Echo60 == "" {
		b.Echo60 = "PXEClient"
	}
	rep := s.reply(m, dhcpv4.MessageTypeAck)
	s.setBoot(rep, b, c, true)
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ServerIPAddr = ip4(s.cfg.ServerIP)
	dst := peer
	if dst == nil || dst.IP.Equal(net.IPv4bcast) || dst.IP.IsUnspecified() {
		if ci := addrOf(m.ClientIPAddr); ci.IsValid() {
			dst = &net.UDPAddr{IP: ip4(ci), Port: dhcpv4.ClientPort}
		} else {
			dst = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		}
	}
	s.event(mac, "pxe-ack", fmt.Sprintf("boot-server ACK (port 4011), boot %s %s", b.Kind, b.File), bootAttrs(attrs.attrs(), b))
	return rep, dst
}
