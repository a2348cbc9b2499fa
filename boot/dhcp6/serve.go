package dhcp6

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6/server6"
	"golang.org/x/net/ipv6"
)

// allServers is All_DHCP_Relay_Agents_and_Servers (RFC 8415 §7.1).
var allServers = net.ParseIP("ff02::1:2")

// listen opens UDP port 547 bound to ifname and joins ff02::1:2 there.
func listen(ifname string, ifi *net.Interface) (net.PacketConn, error) {
	c, err := server6.NewIPv6UDPConn(ifname, &net.UDPAddr{IP: net.IPv6unspecified, Port: 547})
	if err != nil {
		return nil, fmt.Errorf("dhcp6: listen on %s: %w", ifname, err)
	}
	if ifi != nil {
		if err := ipv6.NewPacketConn(c).JoinGroup(ifi, &net.UDPAddr{IP: allServers}); err != nil {
			c.Close()
			return nil, fmt.Errorf("dhcp6: join ff02::1:2 on %s: %w", ifname, err)
		}
	}
	return c, nil
}

// handlerTimeout bounds one packet's handling (store writes, inventory).
const handlerTimeout = 5 * time.Second

// Run serves until ctx ends and returns nil; it closes the socket. Each
// packet is handled on its own goroutine, at most MaxInFlight at once:
// more are dropped and counted.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving DHCPv6", "interface", s.cfg.Interface, "server_ip", s.cfg.ServerIP.String(), "addr", s.conn.LocalAddr().String())
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	uc, _ := s.conn.(*net.UDPConn)
	buf := make([]byte, MaxPacket+1)
	for {
		var n int
		var peer netip.AddrPort
		var err error
		if uc != nil {
			n, peer, err = uc.ReadFromUDPAddrPort(buf)
		} else {
			var a net.Addr
			n, a, err = s.conn.ReadFrom(buf)
			if ua, ok := a.(*net.UDPAddr); ok {
				peer = ua.AddrPort()
			}
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("dhcp6: read: %w", err)
		}
		select {
		case s.sem <- struct{}{}:
		default:
			s.dropped.Add(1)
			s.observe("other", OutcomeOverload)
			s.warn.Warn(logOverloaded, "DHCPv6 handlers all busy: packet dropped", "max_in_flight", s.cfg.MaxInFlight)
			continue
		}
		pkt := append([]byte(nil), buf[:n]...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.sem }()
			hctx, cancel := context.WithTimeout(ctx, handlerTimeout)
			defer cancel()
			out, dst, ok := s.Respond(hctx, pkt, peer)
			if !ok {
				return
			}
			if dst.Addr().Is6() && dst.Addr().IsLinkLocalUnicast() && dst.Addr().Zone() == "" && s.cfg.Interface != "" {
				dst = netip.AddrPortFrom(dst.Addr().WithZone(s.cfg.Interface), dst.Port())
			}
			if _, err := s.conn.WriteTo(out, net.UDPAddrFromAddrPort(dst)); err != nil {
				s.observe("other", OutcomeNotSent)
				s.warn.Warn(logNotSent, "DHCPv6 reply not sent", "dst", dst.String(), "err", err)
			}
		}()
	}
}
