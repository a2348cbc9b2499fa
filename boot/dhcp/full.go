package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// rangeFor picks the range serving a request: the relay's subnet for
// relayed requests, the local range otherwise.
func (s *Server) rangeFor(req *dhcpv4.DHCPv4) (Range, bool) {
	if g := addrOf(req.GatewayIPAddr); g.IsValid() {
		for _, r := range s.cfg.Ranges {
			if r.Subnet.Contains(g) {
				return r, true
			}
		}
		return Range{}, false
	}
	for _, r := range s.cfg.Ranges {
		if !r.Relayed {
			return r, true
		}
	}
	return Range{}, false
}

func (s *Server) respondFull(ctx context.Context, m *dhcpv4.DHCPv4, mac string) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	r, ok := s.rangeFor(m)
	if !ok {
		detail := "no range serves this request"
		if g := addrOf(m.GatewayIPAddr); g.IsValid() {
			detail = "no range for relay " + g.String() + ": configure one with --dhcp-relay-range"
		}
		s.warn.Info(logIgnoredRelay, "DHCP request ignored", "mac", mac, "reason", detail)
		s.eventN(mac, "ignored", detail, attrs)
		return nil, nil
	}
	attrs.setRange(r)
	cid := clientID(m)
	dst := destination(m)
	switch messageType(m) {
	case dhcpv4.MessageTypeDiscover:
		recorded, busy := s.identifyBusy(ctx, c, attrs)
		if busy {
			// The machine is not recorded because the store is busy: an
			// OFFER now would boot it into a script that does not know it
			// (404) and a reboot, each loop another DHCP exchange and more
			// store work. Silence costs one retransmission, a few seconds
			// later, when its record can be written.
			s.warn.Warn(logStoreBusy, "store busy: DISCOVER not answered; the client will retransmit", "mac", mac, "err", attrs.get("inventory_error"))
			s.busySilent.Add(1)
			return nil, nil
		}
		// Clients that do not network-boot (no option 60/77/93/175: BMCs,
		// switches, load generators) get only their problems on the
		// timeline (nak, decline, no-offer, ignored), not every DISCOVER,
		// OFFER and ACK: the timeline is about booting, each entry is a
		// store write, and their lease is in the store anyway.
		if c.NetBoot() {
			s.eventN(mac, "discover", describe("DISCOVER", c), attrs)
		}
		ip, err := s.leases.Offer(mac, cid, r, optAddr(m, dhcpv4.OptionRequestedIPAddress))
		if err != nil {
			s.warn.Warn(logNoOffer, "no address to offer", "mac", mac, "range", r.String(), "err", err)
			s.eventN(mac, "no-offer", err.Error(), attrs)
			return nil, nil
		}
		b := ChooseBoot(c, s.env)
		if !recorded {
			b = unrecorded(attrs)
		}
		rep := s.reply(m, dhcpv4.MessageTypeOffer)
		s.setLease(rep, r, ip)
		s.setBoot(rep, b, c, false)
		if c.NetBoot() {
			a := bootAttrs(map[string]string{"ip": ip.String(), "range": r.String(), "reason": b.Reason}, b)
			s.event(mac, "offer", fmt.Sprintf("OFFER %s, boot %s %s (%s)", ip, b.Kind, b.File, b.Reason), a)
		}
		return rep, dst
	case dhcpv4.MessageTypeRequest:
		return s.request(ctx, m, mac, cid, c, r, attrs, dst)
	case dhcpv4.MessageTypeDecline:
		return s.decline(ctx, m, mac, cid, r, attrs)
	case dhcpv4.MessageTypeRelease:
		ip := addrOf(m.ClientIPAddr)
		attrs.setIP(ip)
		if !ip.IsValid() {
			s.eventN(mac, "ignored", "RELEASE without ciaddr", attrs)
			return nil, nil
		}
		if _, err := s.leases.Release(ctx, mac, ip); err != nil {
			s.eventN(mac, "ignored", "RELEASE "+ip.String()+": "+err.Error(), attrs)
			return nil, nil
		}
		s.eventN(mac, "release", "RELEASE "+ip.String(), attrs)
		return nil, nil
	case dhcpv4.MessageTypeInform:
		b := ChooseBoot(c, s.env)
		rep := s.reply(m, dhcpv4.MessageTypeAck)
		s.setNet(rep, r)
		s.setBoot(rep, b, c, false)
		s.event(mac, "inform", "INFORM answered", bootAttrs(attrs.attrs(), b))
		return rep, dst
	default:
		// OFFER, ACK and NAK are a server's messages, and a packet with no
		// type is no request: all are ignored below.
	}
	s.eventN(mac, "ignored", "message type "+messageType(m).String()+" is not handled", attrs)
	return nil, nil
}

func (s *Server) nak(m *dhcpv4.DHCPv4, mac, why string, attrs *note) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	rep := s.reply(m, dhcpv4.MessageTypeNak)
	rep.UpdateOption(dhcpv4.OptMessage(why))
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ClientIPAddr = net.IPv4zero.To4()
	if addrOf(m.GatewayIPAddr).IsValid() {
		rep.SetBroadcast()
	}
	s.warn.Info(logNak, "DHCP NAK", "mac", mac, "reason", why)
	s.eventN(mac, "nak", "NAK: "+why, attrs)
	dst := destination(m)
	if !addrOf(m.GatewayIPAddr).IsValid() {
		dst = broadcast
	}
	return rep, dst
}

// request answers a REQUEST in full mode. Its state (RFC 2131 §4.3.2)
// decides what the client must have for an ACK: SELECTING (server
// identifier) an offer of the address or its lease; INIT-REBOOT (option
// 50, no ciaddr) and RENEWING/REBINDING (ciaddr) its lease. Nothing is
// written for a client that has neither.
func (s *Server) request(ctx context.Context, m *dhcpv4.DHCPv4, mac, cid string, c Client, r Range, attrs *note, dst *net.UDPAddr) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	sid := optAddr(m, dhcpv4.OptionServerIdentifier)
	ip := optAddr(m, dhcpv4.OptionRequestedIPAddress)
	state, need := "init-reboot", NeedLease
	switch {
	case sid.IsValid():
		state, need = "selecting", NeedOffer
		if sid != s.cfg.ServerIP {
			// Another server's (on a segment appliances share, for
			// every client another appliance's): not a problem, so a
			// client that does not network-boot gets no entry.
			if c.NetBoot() {
				s.eventN(mac, "ignored", "REQUEST for server "+sid.String()+": the client chose another server", attrs)
			}
			return nil, nil
		}
	case addrOf(m.ClientIPAddr).IsValid():
		state = "renewing"
		ip = addrOf(m.ClientIPAddr)
	}
	attrs.set("state", state)
	if !ip.IsValid() {
		s.eventN(mac, "ignored", "REQUEST ("+state+") without an address", attrs)
		return nil, nil
	}
	attrs.setIP(ip)
	if !r.Contains(ip) {
		if state == "init-reboot" && r.Subnet.Contains(ip) && !s.leases.hasLease(mac) {
			// The right network, an address that is not ours, a client we
			// have no record of: another server's client (§4.3.2).
			s.warn.Info(logUnknownReboot, "INIT-REBOOT REQUEST from a client with no lease: not answered", "mac", mac, "ip", ip.String())
			s.eventN(mac, "ignored", "REQUEST (init-reboot) for "+ip.String()+" (outside "+r.String()+") from a client with no lease here: not answered (RFC 2131 4.3.2)", attrs)
			return nil, nil
		}
		if state == "selecting" || r.Subnet.Contains(ip) || !s.inAnyRange(ip) {
			return s.nak(m, mac, fmt.Sprintf("%s is not in range %s", ip, r), attrs)
		}
		return s.nak(m, mac, fmt.Sprintf("%s belongs to another subnet than %s", ip, r.Subnet), attrs)
	}
	l, err := s.leases.Bind(ctx, mac, cid, need, ip, r, s.cfg.LeaseTime, hostnameOK(m.HostName()), relayOf(m))
	switch {
	case errors.Is(err, ErrNoLease) && state == "init-reboot":
		// RFC 2131 §4.3.2: "If the DHCP server has no record of this
		// client, then it MUST remain silent".
		s.warn.Info(logUnknownReboot, "INIT-REBOOT REQUEST from a client with no lease: not answered", "mac", mac, "ip", ip.String())
		s.eventN(mac, "ignored", "REQUEST (init-reboot) for "+ip.String()+" from a client with no lease here: not answered (RFC 2131 4.3.2)", attrs)
		return nil, nil
	case errors.Is(err, ErrNoLease):
		return s.nak(m, mac, ip.String()+" is not leased to this client", attrs)
	case errors.Is(err, ErrOtherAddress):
		return s.nak(m, mac, fmt.Sprintf("%s is not this client's address (%v)", ip, err), attrs)
	case errors.Is(err, ErrNotOffered):
		return s.nak(m, mac, ip.String()+" was not offered to this client", attrs)
	case errors.Is(err, ErrTaken):
		return s.nak(m, mac, ip.String()+" is leased to another client", attrs)
	case err != nil:
		s.warn.Log(slog.LevelError, logLeaseNotStored, "lease not stored: no ACK", "mac", mac, "ip", ip.String(), "err", err)
		s.eventN(mac, "ack-failed", "lease for "+ip.String()+" not stored: "+err.Error(), attrs)
		return nil, nil
	}
	b := ChooseBoot(c, s.env)
	if !s.identify(ctx, c, attrs) {
		b = unrecorded(attrs)
	}
	rep := s.reply(m, dhcpv4.MessageTypeAck)
	s.setLease(rep, r, ip)
	s.setBoot(rep, b, c, false)
	if c.NetBoot() {
		a := bootAttrs(attrs.attrs(), b)
		a["expires"] = time.Unix(l.GetExpiresUnix(), 0).UTC().Format(time.RFC3339)
		s.event(mac, "ack", fmt.Sprintf("ACK %s (%s) until %s, boot %s %s", ip, state, a["expires"], b.Kind, b.File), a)
	}
	return rep, dst
}

// decline handles a DECLINE in full mode: honoured (the address is
// quarantined) only from the client that holds or was offered the
// address; otherwise ignored, logged (rate-limited) and recorded on the
// sender's timeline. A DECLINE naming another server is not ours.
func (s *Server) decline(ctx context.Context, m *dhcpv4.DHCPv4, mac, cid string, r Range, attrs *note) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	ip := optAddr(m, dhcpv4.OptionRequestedIPAddress)
	if sid := optAddr(m, dhcpv4.OptionServerIdentifier); sid.IsValid() && sid != s.cfg.ServerIP {
		s.eventN(mac, "ignored", "DECLINE for server "+sid.String()+": not ours", attrs)
		return nil, nil
	}
	if !ip.IsValid() || !r.Contains(ip) {
		s.eventN(mac, "ignored", "DECLINE without an address of ours", attrs)
		return nil, nil
	}
	attrs.setIP(ip)
	_, err := s.leases.Decline(ctx, mac, cid, ip, r)
	switch {
	case errors.Is(err, ErrPinned):
		s.warn.Warn(logDeclineIgnored, "DECLINE of a pinned address: ignored", "mac", mac, "ip", ip.String())
		s.eventN(mac, "ignored", "DECLINE "+ip.String()+" ignored: "+err.Error(), attrs)
		return nil, nil
	case errors.Is(err, ErrNotHolder), errors.Is(err, ErrTaken):
		s.warn.Warn(logDeclineIgnored, "DECLINE from a client that neither holds nor was offered the address: ignored", "mac", mac, "ip", ip.String())
		s.eventN(mac, "ignored", "DECLINE "+ip.String()+" ignored: this client neither holds nor was offered it", attrs)
		return nil, nil
	case err != nil:
		s.warn.Log(slog.LevelError, logLeaseNotStored, "DECLINE not stored", "mac", mac, "ip", ip.String(), "err", err)
		s.eventN(mac, "ignored", "DECLINE "+ip.String()+": "+err.Error(), attrs)
		return nil, nil
	}
	s.warn.Warn(logDecline, "address declined by client: quarantined", "mac", mac, "ip", ip.String(), "quarantine", s.cfg.DeclineQuarantine.String())
	s.eventN(mac, "decline", fmt.Sprintf("DECLINE %s: address in use on the network, quarantined for %s", ip, s.cfg.DeclineQuarantine), attrs)
	return nil, nil
}

func (s *Server) inAnyRange(ip netip.Addr) bool {
	for _, r := range s.cfg.Ranges {
		if r.Subnet.Contains(ip) {
			return true
		}
	}
	return false
}
