package ipmi

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"time"
)

// probeBound is the longest protocol auto waits for an IPMI answer before
// it settles for Redfish: an IPMI BMC on a LAN answers in milliseconds.
const probeBound = time.Second

// getChannelAuthCaps is an IPMI v1.5 session-less "Get Channel
// Authentication Capabilities" request in an RMCP datagram (channel: the
// current one, IPMI v2 extended data; privilege: administrator). Every
// IPMI BMC answers it before any session exists.
var getChannelAuthCaps = []byte{
	0x06, 0x00, 0xff, 0x07, // RMCP: version, reserved, sequence (no ack), class IPMI
	0x00, 0, 0, 0, 0, 0, 0, 0, 0, // session: auth type none, sequence 0, session id 0
	0x09,             // message length
	0x20, 0x18, 0xc8, // BMC address, NetFn App (request), checksum
	0x81, 0x00, 0x38, // software id, sequence, command 0x38
	0x8e, 0x04, 0xb5, // channel 0xe (current) | v2 data, privilege admin, checksum
}

// narrowAuto decides, for a target under protocol auto whose IPMI and
// Redfish ports differ (Target.PortFor), which protocol to open: when
// nothing answers IPMI's port within probeBound but Redfish's port
// accepts a connection, the call goes to Redfish alone. Otherwise the
// target is unchanged (IPMI first, then Redfish, as auto always was).
// Without the probe a Redfish-only BMC would be missed: the session waits
// for every provider's open, and the IPMI ones wait out the deadline on a
// silent port.
func (c *Controller) narrowAuto(ctx context.Context, t Target) Target {
	ipmiPort, rfPort := t.PortFor(ProtocolIPMI), t.PortFor(ProtocolRedfish)
	if t.Protocol != ProtocolAuto || ipmiPort == rfPort || !slices.Contains(c.cfg.Providers, RedfishProviderName) {
		return t
	}
	ctx, cancel := context.WithTimeout(ctx, probeBound)
	defer cancel()
	ipmiUp, rfUp := make(chan bool, 1), make(chan bool, 1)
	go func() { ipmiUp <- probeIPMI(ctx, net.JoinHostPort(t.Host, strconv.Itoa(ipmiPort))) }()
	go func() { rfUp <- probeTCP(ctx, net.JoinHostPort(t.Host, strconv.Itoa(rfPort))) }()
	if <-ipmiUp || !<-rfUp {
		return t
	}
	c.log.Debug("bmc: no IPMI answer, Redfish port open: using Redfish", "bmc", t.String())
	t.Protocol, t.Port = ProtocolRedfish, rfPort
	return t
}

// probeIPMI reports whether anything answers getChannelAuthCaps at addr
// (UDP) before ctx ends.
func probeIPMI(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	buf := make([]byte, 512)
	// Datagrams get lost: ask again every 250 ms until an answer, a
	// refusal (ICMP port unreachable) or the deadline.
	for {
		if _, err := conn.Write(getChannelAuthCaps); err != nil {
			return false
		}
		_ = conn.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		n, err := conn.Read(buf)
		if err == nil && n > 0 {
			return true
		}
		var ne net.Error
		if ctx.Err() != nil || !errors.As(err, &ne) || !ne.Timeout() {
			return false
		}
	}
}

// probeTCP reports whether addr accepts a TCP connection before ctx ends.
func probeTCP(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}
