package dhcp

import (
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Observer is told the outcome of every packet received (corrald counts
// them for /metrics), and for each answer sent how long the server took:
// from the request's arrival (the kernel's receive stamp where the socket
// gives one, else its read) to the answer's write, the server's own share
// of a client's wait (its queue and its lease's flush included, the
// network and the client not). Its labels come from fixed sets — the
// request's message type (MessageTypeName) and one of the Outcome* values
// — never from a client's MAC or address. Its methods must be quick and
// safe for concurrent use.
type Observer interface {
	Packet(msgType, outcome string)
	Answered(msgType string, took time.Duration)
}

// Packet outcomes given to Observer.
const (
	OutcomeOffer     = "offer"            // an OFFER was sent
	OutcomeAck       = "ack"              // an ACK was sent
	OutcomeNak       = "nak"              // a NAK was sent
	OutcomeIgnored   = "ignored"          // no answer (not ours, RFC 2131 silence, not handled; the timeline says why)
	OutcomeNotSent   = "not_sent"         // the answer could not be sent
	OutcomeOverload  = "dropped_overload" // dropped: MaxInFlight handlers busy
	OutcomeMalformed = "malformed"        // did not parse
	OutcomeOther     = "other"            // an answer of another type
	OutcomeLeft      = "left_to_peer"     // a DISCOVER another appliance of the fleet answers (Config.Balance)
)

// MessageTypeName is the Observer label of a DHCP message type: its
// lower-case name, "none" for BOOTP, "other" for values RFC 2132 and its
// successors do not name.
func MessageTypeName(t dhcpv4.MessageType) string {
	switch t {
	case dhcpv4.MessageTypeNone:
		return "none"
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeOffer, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeDecline,
		dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak, dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform:
		return strings.ToLower(t.String())
	}
	return "other"
}

func (s *Server) observe(m *dhcpv4.DHCPv4, outcome string) {
	if s.cfg.Observer == nil {
		return
	}
	t := "unknown"
	if m != nil {
		t = MessageTypeName(messageType(m))
	}
	s.cfg.Observer.Packet(t, outcome)
}

// Dropped is how many packets were dropped because MaxInFlight handlers
// were busy.
func (s *Server) Dropped() uint64 { return s.dropped.Load() }

// Malformed is how many packets did not parse.
func (s *Server) Malformed() uint64 { return s.bad.Load() }

// Superseded is how many older bindings were released because their
// client was bound again in the same subnet (two appliances each bound it
// before seeing the other's binding).
func (s *Server) Superseded() uint64 {
	if s.leases == nil {
		return 0
	}
	return s.leases.superseded.Load()
}

// BusySilent is how many DISCOVERs were left unanswered because the
// store was busy when the client's machine was to be recorded.
func (s *Server) BusySilent() uint64 { return s.busySilent.Load() }

// Contended is how many bindings were refused because the fleet had
// already bound the client to another live address in the subnet (the
// client was NAKed and is offered that address when it DISCOVERs again).
func (s *Server) Contended() uint64 {
	if s.leases == nil {
		return 0
	}
	return s.leases.contended.Load()
}
