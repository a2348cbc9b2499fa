package dhcp6

import (
	"math"
	"net/netip"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv6"
)

// Observer is told the outcome of every datagram received (corrald counts
// them for /metrics). Its labels come from fixed sets: the client
// message's type (MessageTypeName) and one of the Outcome* values, never
// a client's DUID or address. Its method must be quick and safe for
// concurrent use.
type Observer interface {
	Packet(msgType, outcome string)
}

// Packet outcomes given to Observer.
const (
	OutcomeAdvertise    = "advertise"        // an ADVERTISE was sent
	OutcomeReply        = "reply"            // a REPLY was sent
	OutcomeIgnored      = "ignored"          // no answer (another server's, RFC 8415 silence)
	OutcomeMalformed    = "malformed"        // did not parse, oversized, too deep, not a client message
	OutcomeOverBudget   = "over_budget"      // over its client's packet budget
	OutcomeRelayRefused = "relay_refused"    // a Relay-Forward from a source not in Config.RelayFrom
	OutcomeNoRange      = "no_range"         // from a link no range serves
	OutcomeNotSent      = "not_sent"         // the answer could not be sent
	OutcomeOverload     = "dropped_overload" // dropped: MaxInFlight handlers busy
)

// MessageTypeName is the Observer label of a client message type: its
// lower-case RFC 8415 name, "other" for anything else.
func MessageTypeName(t dhcpv6.MessageType) string {
	switch t {
	case dhcpv6.MessageTypeRelayForward:
		return "relay-forward"
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeConfirm, dhcpv6.MessageTypeRenew,
		dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline, dhcpv6.MessageTypeInformationRequest:
		return strings.ToLower(strings.ReplaceAll(t.String(), " ", "-"))
	default: // server, relay-reply and leasequery messages: not a client's
		return "other"
	}
}

func (s *Server) observe(msgType, outcome string) {
	if s.cfg.Observer != nil {
		s.cfg.Observer.Packet(msgType, outcome)
	}
}

// RangeStat is one range's lease count for /metrics.
type RangeStat struct {
	// Range is "START-END".
	Range string
	// Bound is the live leases in the range; Free the addresses that can
	// be given out (neither bound, offered nor quarantined).
	Bound, Free float64
}

// LeaseStats counts each range's bound and free addresses (it walks the
// lease table, at most MaxLeases records).
func (s *Server) LeaseStats() []RangeStat {
	out := make([]RangeStat, len(s.cfg.Ranges))
	for i, r := range s.cfg.Ranges {
		out[i].Range = r.Start.String() + "-" + r.End.String()
	}
	now := s.cfg.Now()
	p := s.leases
	p.mu.Lock()
	busy := make([]float64, len(out))
	for ip, e := range p.byIP {
		for i, r := range s.cfg.Ranges {
			if !r.Contains(ip) {
				continue
			}
			if e.live(now) {
				out[i].Bound++
			}
			if !e.reusable(now) {
				busy[i]++
			}
		}
	}
	for ip, o := range p.offers {
		if e, ok := p.byIP[ip]; ok && !e.reusable(now) || !now.Before(o.until) {
			continue
		}
		for i, r := range s.cfg.Ranges {
			if r.Contains(ip) {
				busy[i]++
			}
		}
	}
	p.mu.Unlock()
	for i, r := range s.cfg.Ranges {
		out[i].Free = max(rangeSize(r)-busy[i], 0)
	}
	return out
}

// rangeSize is the number of addresses in [Start, End] (as a float: a
// range may hold 2^64 and more).
func rangeSize(r Range) float64 {
	a, b := r.Start.As16(), r.End.As16()
	hi := func(x [16]byte) (uint64, uint64) {
		var h, l uint64
		for i := range 8 {
			h = h<<8 | uint64(x[i])
			l = l<<8 | uint64(x[8+i])
		}
		return h, l
	}
	ah, al := hi(a)
	bh, bl := hi(b)
	dh, dl := bh-ah, bl-al
	if bl < al {
		dh--
	}
	return float64(dh)*math.Pow(2, 64) + float64(dl) + 1
}

// allowedRelay reports whether a Relay-Forward from peer may be served:
// any source when Config.RelayFrom is empty, else one inside it.
func (s *Server) allowedRelay(peer netip.AddrPort) bool {
	if len(s.cfg.RelayFrom) == 0 {
		return true
	}
	a := peer.Addr().WithZone("").Unmap()
	for _, p := range s.cfg.RelayFrom {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
