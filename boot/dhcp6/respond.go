package dhcp6

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/corralhq/corral/internal/apierr"
)

// maxIAs bounds the IA_NA options one message is answered for.
const maxIAs = 4

// maxBindTries bounds the addresses one IA_NA's binding tries when the
// store refuses them (a fleet's appliances racing for one address).
const maxBindTries = 4

// maxDUID is RFC 8415's bound on a DUID (128 octets) plus its type.
const maxDUID = 130

// enterpriseEDK2 is the enterprise number EDK2's HTTP boot sends in
// option 16 (IANA's 343, Intel); echoed with HTTPClient.
const enterpriseEDK2 = 343

// request is one client message with where it came from.
type request struct {
	m      *dhcpv6.Message
	relays []*dhcpv6.RelayMessage // outermost first
	peer   netip.AddrPort
	r      Range
	mac    string
	key    string // hex DUID, for budgets and leases
	duid   dhcpv6.DUID
	// typ and outcome label the datagram for Observer.
	typ, outcome string
}

// Respond decides the answer to one datagram from peer: the bytes to send
// and where (ok false: stay silent). Malformed packets are counted and
// logged (rate-limited). It is safe for concurrent use.
func (s *Server) Respond(ctx context.Context, b []byte, peer netip.AddrPort) (out []byte, dst netip.AddrPort, ok bool) {
	req := request{peer: peer, typ: "other", outcome: OutcomeIgnored}
	out, dst, ok = s.respond(ctx, b, &req)
	s.observe(req.typ, req.outcome)
	return out, dst, ok
}

func (s *Server) respond(ctx context.Context, b []byte, req *request) (out []byte, dst netip.AddrPort, ok bool) {
	peer := req.peer
	if len(b) > MaxPacket {
		s.malformed(req, "oversized packet", len(b))
		return nil, dst, false
	}
	d, err := dhcpv6.FromBytes(b)
	if err != nil {
		s.malformed(req, "does not parse", len(b))
		return nil, dst, false
	}
	if d.IsRelay() {
		req.typ = MessageTypeName(dhcpv6.MessageTypeRelayForward)
		if !s.allowedRelay(peer) {
			s.relayRefused.Add(1)
			req.outcome = OutcomeRelayRefused
			s.warn.Warn(logRelay, "DHCPv6 Relay-Forward from a source that is not an allowed relay (--dhcp6-relay-from): dropped", "peer", peer.String())
			return nil, dst, false
		}
	}
	for d.IsRelay() {
		r, _ := d.(*dhcpv6.RelayMessage)
		if r == nil || r.MessageType != dhcpv6.MessageTypeRelayForward {
			s.malformed(req, "relay message that is not a Relay-Forward", len(b))
			return nil, dst, false
		}
		if len(req.relays) >= MaxHops || r.HopCount >= MaxHops {
			s.malformed(req, "relay hop count over "+strconv.Itoa(MaxHops), len(b))
			return nil, dst, false
		}
		req.relays = append(req.relays, r)
		if d = r.Options.RelayMessage(); d == nil {
			s.malformed(req, "Relay-Forward without a relay message", len(b))
			return nil, dst, false
		}
	}
	m, _ := d.(*dhcpv6.Message)
	if m == nil {
		s.malformed(req, "no client message", len(b))
		return nil, dst, false
	}
	req.typ = MessageTypeName(m.MessageType)
	var found bool
	if req.r, found = s.rangeFor(req.relays); !found {
		req.outcome = OutcomeNoRange
		s.warn.Warn(logNoAddrs, "DHCPv6 request from a link no range serves", "peer", peer.String(), "link", linkOf(req.relays))
		return nil, dst, false
	}
	rep := s.handle(ctx, m, req)
	if rep == nil {
		return nil, dst, false
	}
	if rep.MessageType == dhcpv6.MessageTypeAdvertise {
		req.outcome = OutcomeAdvertise
	} else {
		req.outcome = OutcomeReply
	}
	var msg dhcpv6.DHCPv6 = rep
	for i := len(req.relays) - 1; i >= 0; i-- {
		f := req.relays[i]
		rr := &dhcpv6.RelayMessage{MessageType: dhcpv6.MessageTypeRelayReply, HopCount: f.HopCount, LinkAddr: f.LinkAddr, PeerAddr: f.PeerAddr}
		if iid := f.Options.InterfaceID(); iid != nil {
			rr.Options.Add(dhcpv6.OptInterfaceID(iid))
		}
		rr.Options.Add(dhcpv6.OptRelayMessage(msg))
		msg = rr
	}
	return msg.ToBytes(), peer, true
}

// linkOf is the innermost relay's link-address ("" when not relayed).
func linkOf(relays []*dhcpv6.RelayMessage) string {
	if len(relays) == 0 {
		return ""
	}
	return relays[len(relays)-1].LinkAddr.String()
}

// rangeFor is the range serving the request's link: the local range for
// a direct request, the relayed range containing the innermost relay's
// link-address otherwise.
func (s *Server) rangeFor(relays []*dhcpv6.RelayMessage) (Range, bool) {
	if len(relays) == 0 {
		for _, r := range s.cfg.Ranges {
			if !r.Relayed {
				return r, true
			}
		}
		return Range{}, false
	}
	la, ok := netip.AddrFromSlice(relays[len(relays)-1].LinkAddr)
	if !ok {
		return Range{}, false
	}
	la = la.Unmap()
	for _, r := range s.cfg.Ranges {
		if r.Relayed && r.Prefix.Contains(la) {
			return r, true
		}
	}
	return Range{}, false
}

func (s *Server) malformed(req *request, why string, n int) {
	s.bad.Add(1)
	req.outcome = OutcomeMalformed
	s.warn.Warn(logMalformed, "dropping malformed DHCPv6 packet", "peer", req.peer.String(), "reason", why, "bytes", n)
}

// macOf is the client's MAC: from a DUID-LL/LLT of an Ethernet address,
// else the innermost relay's option 79, else a link-local EUI-64 source.
func macOf(duid dhcpv6.DUID, relays []*dhcpv6.RelayMessage, peer netip.AddrPort) string {
	var hw net.HardwareAddr
	switch d := duid.(type) {
	case *dhcpv6.DUIDLL:
		if d.HWType == iana.HWTypeEthernet {
			hw = d.LinkLayerAddr
		}
	case *dhcpv6.DUIDLLT:
		if d.HWType == iana.HWTypeEthernet {
			hw = d.LinkLayerAddr
		}
	}
	if len(hw) != 6 && len(relays) > 0 {
		if t, a := relays[len(relays)-1].Options.ClientLinkLayerAddress(); t == iana.HWTypeEthernet {
			hw = a
		}
	}
	if len(hw) != 6 && len(relays) == 0 {
		if a := peer.Addr(); a.Is6() && a.IsLinkLocalUnicast() {
			b := a.As16()
			if b[11] == 0xff && b[12] == 0xfe {
				hw = net.HardwareAddr{b[8] ^ 0x02, b[9], b[10], b[13], b[14], b[15]}
			}
		}
	}
	if len(hw) != 6 || [6]byte(hw) == [6]byte{} || hw[0]&1 == 1 {
		return ""
	}
	return hw.String()
}

// handle answers one client message (nil: no answer).
func (s *Server) handle(ctx context.Context, m *dhcpv6.Message, req *request) *dhcpv6.Message {
	req.m = m
	t := m.MessageType
	switch t {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeConfirm, dhcpv6.MessageTypeRenew,
		dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline, dhcpv6.MessageTypeInformationRequest:
	default:
		s.malformed(req, "not a client message: "+t.String(), 0)
		return nil
	}
	req.duid = m.Options.ClientID()
	if req.duid != nil {
		raw := req.duid.ToBytes()
		if len(raw) > maxDUID {
			s.malformed(req, "client DUID over 128 octets", len(raw))
			return nil
		}
		req.key = hex.EncodeToString(raw)
	} else if t != dhcpv6.MessageTypeInformationRequest {
		s.malformed(req, t.String()+" without a client identifier", 0)
		return nil
	}
	// RFC 8415 §16: which messages must and must not name a server.
	sid := m.Options.ServerID()
	switch t {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeConfirm, dhcpv6.MessageTypeRebind:
		if sid != nil {
			return nil
		}
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		if sid == nil || !sid.Equal(s.duid) {
			return nil // another server's
		}
	default: // INFORMATION-REQUEST (handle's first switch let only client messages through)
		if sid != nil && !sid.Equal(s.duid) {
			return nil
		}
	}
	budget := req.key
	if budget == "" {
		budget = req.peer.Addr().String()
	}
	if !s.rates.take(budget) {
		s.limited.Add(1)
		req.outcome = OutcomeOverBudget
		s.warn.Warn(logLimited, "DHCPv6 client over its packet budget: dropped", "peer", req.peer.String(), "duid", trim(req.key))
		return nil
	}
	req.mac = macOf(req.duid, req.relays, req.peer)
	c := Classify(m, req.mac)
	rapid := t == dhcpv6.MessageTypeSolicit && !s.cfg.NoRapidCommit && m.GetOneOption(dhcpv6.OptionRapidCommit) != nil
	rt := dhcpv6.MessageTypeReply
	if t == dhcpv6.MessageTypeSolicit && !rapid {
		rt = dhcpv6.MessageTypeAdvertise
	}
	rep := &dhcpv6.Message{MessageType: rt, TransactionID: m.TransactionID}
	if req.duid != nil {
		rep.AddOption(dhcpv6.OptClientID(req.duid))
	}
	rep.AddOption(dhcpv6.OptServerID(s.duid))
	if rapid {
		rep.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	}
	if rt == dhcpv6.MessageTypeAdvertise {
		// 255: the client requests at once instead of waiting out its
		// first retransmission time for better offers.
		rep.AddOption(dhcpv6.OptPreference(255))
	}
	var detail string
	switch t {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRequest:
		detail = s.assign(ctx, req, rep, t == dhcpv6.MessageTypeRequest || rapid)
	case dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRebind:
		detail = s.extend(ctx, req, rep, t == dhcpv6.MessageTypeRebind)
	case dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		detail = s.end(ctx, req, rep, t == dhcpv6.MessageTypeDecline)
	case dhcpv6.MessageTypeConfirm:
		var ok bool
		if detail, ok = s.confirm(req, rep); !ok {
			return nil
		}
	default: // INFORMATION-REQUEST
		detail = "configuration only"
	}
	var file string
	if t != dhcpv6.MessageTypeRelease && t != dhcpv6.MessageTypeDecline {
		file = s.addConfig(ctx, req, c, rep)
	}
	if req.mac != "" {
		attrs := map[string]string{"peer": req.peer.String(), "duid": trim(req.key), "reply": strings.ToLower(rt.String())}
		if len(req.relays) > 0 {
			attrs["relay_link"] = linkOf(req.relays)
		}
		if c.HasArch {
			attrs["arch"] = strconv.Itoa(int(c.Arch))
		}
		if c.IPXE {
			attrs["ipxe"] = "true"
		}
		if file != "" {
			attrs["file"] = file
		}
		s.cfg.Timeline.Event(req.mac, "dhcp6", strings.ToLower(t.String()), rt.String()+": "+detail, attrs)
	}
	return rep
}

// trim bounds a hex DUID for logs and timelines.
func trim(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func (s *Server) lifetimes() (t1, t2, valid time.Duration) {
	return s.cfg.LeaseTime / 2, s.cfg.LeaseTime * 4 / 5, s.cfg.LeaseTime
}

// ias are the request's IA_NAs, at most maxIAs.
func ias(m *dhcpv6.Message) []*dhcpv6.OptIANA {
	all := m.Options.IANA()
	if len(all) > maxIAs {
		all = all[:maxIAs]
	}
	return all
}

func statusIA(ia *dhcpv6.OptIANA, code iana.StatusCode, msg string) *dhcpv6.OptIANA {
	out := &dhcpv6.OptIANA{IaId: ia.IaId}
	out.Options.Add(&dhcpv6.OptStatusCode{StatusCode: code, StatusMessage: msg})
	return out
}

func (s *Server) lease(req *request, iaid [4]byte) Lease {
	l := Lease{Key: clientKey(req.duid.ToBytes(), iaid), DUID: req.duid.ToBytes(), IAID: iaid, MAC: req.mac, Subnet: req.r.Prefix}
	if len(req.relays) > 0 {
		l.Relay = linkOf(req.relays)
	}
	return l
}

// assign answers SOLICIT (offers reserved, or bound with Rapid Commit)
// and REQUEST (bound): one address per IA_NA from the link's range.
func (s *Server) assign(ctx context.Context, req *request, rep *dhcpv6.Message, commit bool) string {
	t1, t2, valid := s.lifetimes()
	detail := "no IA_NA asked for"
	for _, ia := range ias(req.m) {
		l := s.lease(req, ia.IaId)
		ip, err := s.leases.Pick(l.Key, req.r)
		// A binding that loses its compare-and-swap (another appliance
		// of a fleet wrote the address first; memory now knows it) is
		// tried again on the next free address, a few times.
		for try := 0; err == nil && commit; try++ {
			if err = s.leases.Bind(ctx, ip, l, valid); !errors.Is(err, ErrTaken) || try == maxBindTries-1 {
				break
			}
			ip, err = s.leases.Pick(l.Key, req.r)
		}
		if err != nil {
			if !errors.Is(err, ErrExhausted) && !errors.Is(err, ErrTaken) {
				s.warn.Warn(logStore, "DHCPv6 lease not stored", "mac", req.mac, "ip", ip.String(), "err", err)
			} else {
				s.warn.Warn(logNoAddrs, "DHCPv6 range has no address for a client", "mac", req.mac, "range", req.r.Prefix.String(), "err", err)
			}
			rep.AddOption(statusIA(ia, iana.StatusNoAddrsAvail, "no address available"))
			detail = "no address available"
			continue
		}
		out := &dhcpv6.OptIANA{IaId: ia.IaId, T1: t1, T2: t2}
		out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: ip.AsSlice(), PreferredLifetime: valid, ValidLifetime: valid})
		rep.AddOption(out)
		if commit {
			detail = "bound " + ip.String() + " (IAID " + iaidString(ia.IaId) + ")"
		} else {
			detail = "offered " + ip.String() + " (IAID " + iaidString(ia.IaId) + ")"
		}
	}
	return detail
}

// extend answers RENEW and REBIND: each address that is the client's
// live binding is extended; another is NoBinding, or (REBIND) lifetime 0
// when it is not on the link.
func (s *Server) extend(ctx context.Context, req *request, rep *dhcpv6.Message, rebind bool) string {
	t1, t2, valid := s.lifetimes()
	detail := "nothing to extend"
	for _, ia := range ias(req.m) {
		l := s.lease(req, ia.IaId)
		addrs := ia.Options.Addresses()
		if len(addrs) == 0 {
			if ip, ok := s.leases.binding(l.Key); ok {
				addrs = []*dhcpv6.OptIAAddress{{IPv6Addr: ip.AsSlice()}}
			}
		}
		out := &dhcpv6.OptIANA{IaId: ia.IaId, T1: t1, T2: t2}
		bound := false
		for i, a := range addrs {
			if i >= maxIAs {
				break
			}
			ip, ok := netip.AddrFromSlice(a.IPv6Addr)
			if !ok {
				continue
			}
			if err := s.leases.Renew(ctx, ip, l, valid); err == nil {
				out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: ip.AsSlice(), PreferredLifetime: valid, ValidLifetime: valid})
				bound = true
				detail = "extended " + ip.String()
			} else if rebind && !req.r.Prefix.Contains(ip) {
				out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: ip.AsSlice()})
				bound = true
				detail = ip.String() + " is not on this link: lifetime 0"
			}
		}
		if !bound {
			rep.AddOption(statusIA(ia, iana.StatusNoBinding, "no binding for this IA"))
			detail = "no binding"
			continue
		}
		rep.AddOption(out)
	}
	return detail
}

// end answers RELEASE and DECLINE for the client's own bindings.
func (s *Server) end(ctx context.Context, req *request, rep *dhcpv6.Message, declined bool) string {
	detail := "nothing released"
	for _, ia := range ias(req.m) {
		l := s.lease(req, ia.IaId)
		ended := false
		for i, a := range ia.Options.Addresses() {
			if i >= maxIAs {
				break
			}
			ip, ok := netip.AddrFromSlice(a.IPv6Addr)
			if !ok {
				continue
			}
			if err := s.leases.End(ctx, ip, l.Key, declined); err == nil {
				ended = true
				if declined {
					detail = "declined " + ip.String() + ": quarantined"
					s.warn.Warn(logDecline, "DHCPv6 client declined an address (in use on the link?)", "mac", req.mac, "ip", ip.String())
				} else {
					detail = "released " + ip.String()
				}
			}
		}
		if !ended {
			rep.AddOption(statusIA(ia, iana.StatusNoBinding, "no binding for this IA"))
		}
	}
	rep.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "done"})
	return detail
}

// confirm answers CONFIRM: Success when every address is on the link,
// NotOnLink otherwise, silence when it names none.
func (s *Server) confirm(req *request, rep *dhcpv6.Message) (string, bool) {
	n := 0
	for _, ia := range ias(req.m) {
		for _, a := range ia.Options.Addresses() {
			ip, ok := netip.AddrFromSlice(a.IPv6Addr)
			n++
			if !ok || !req.r.Prefix.Contains(ip) {
				rep.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNotOnLink, StatusMessage: "not on this link"})
				return "not on link", true
			}
		}
	}
	if n == 0 {
		return "", false
	}
	rep.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "on link"})
	return "on link", true
}

// addConfig adds DNS servers and the boot options; a network-booting
// client with a MAC becomes a machine.
func (s *Server) addConfig(ctx context.Context, req *request, c Client, rep *dhcpv6.Message) string {
	if len(req.r.DNS) > 0 {
		ips := make([]net.IP, 0, len(req.r.DNS))
		for _, d := range req.r.DNS {
			ips = append(ips, d.AsSlice())
		}
		rep.AddOption(dhcpv6.OptDNS(ips...))
	}
	if !c.NetBoot() && !req.m.IsOptionRequested(dhcpv6.OptionBootfileURL) {
		return ""
	}
	if c.MAC != "" {
		if _, _, err := s.cfg.Inventory.EnsureMachineForMAC(ctx, c.MAC); err != nil {
			if errors.Is(err, apierr.ErrExhausted) {
				s.warn.Warn(logInventory, "discovered-machine cap reached: DHCPv6 client gets an address and no boot file", "mac", c.MAC)
			} else {
				s.warn.Warn(logInventory, "inventory refused a DHCPv6 client: no boot file", "mac", c.MAC, "err", err)
			}
			return ""
		}
	}
	b := ChooseBoot(c, Env{HTTPBase: s.cfg.HTTPBase, TFTPHost: s.cfg.TFTPHost, Has: s.cfg.Catalog.Has})
	if b.URL == "" {
		return ""
	}
	rep.AddOption(dhcpv6.OptBootFileURL(b.URL))
	if b.HTTPClient {
		rep.AddOption(&dhcpv6.OptVendorClass{EnterpriseNumber: enterpriseEDK2, Data: [][]byte{[]byte("HTTPClient")}})
	}
	return b.URL
}
