package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// dhcpNet is the machines' side of DHCP: one UDP socket on the broadcast
// segment (port 68, bound to the client end, broadcast) and one relay
// socket (giaddr:67, unicast to the server), each read by one goroutine
// that hands answers to the waiting machine by transaction id.
type dhcpNet struct {
	bcast, relay *net.UDPConn
	servers      []*net.UDPAddr

	mu      sync.Mutex
	waiting map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4
	// unmatched counts answers for no waiting exchange (late answers to
	// a retransmission already answered, or another machine's).
	unmatched int
}

// newDHCPNet opens the sockets; servers are the appliances serving DHCP.
func newDHCPNet(topo *topology, servers []netip.Addr) (*dhcpNet, error) {
	d := &dhcpNet{waiting: map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4{}}
	for _, a := range servers {
		d.servers = append(d.servers, &net.UDPAddr{IP: a.AsSlice(), Port: 67})
	}
	err := topo.client.do(func() error {
		lc := net.ListenConfig{Control: bindDevice(topo.clientIf)}
		pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:68")
		if err != nil {
			return fmt.Errorf("broadcast socket: %w", err)
		}
		d.bcast = pc.(*net.UDPConn)
		rc, err := net.ListenPacket("udp4", giaddr.String()+":67")
		if err != nil {
			d.bcast.Close()
			return fmt.Errorf("relay socket: %w", err)
		}
		d.relay = rc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range []*net.UDPConn{d.bcast, d.relay} {
		_ = c.SetReadBuffer(8 << 20)
		_ = c.SetWriteBuffer(8 << 20)
	}
	return d, nil
}

// run reads both sockets until ctx ends.
func (d *dhcpNet) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range []*net.UDPConn{d.bcast, d.relay} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1500)
			for {
				n, _, err := c.ReadFrom(buf)
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				m, err := dhcpv4.FromBytes(buf[:n])
				if err != nil || m.OpCode != dhcpv4.OpcodeBootReply {
					continue
				}
				d.mu.Lock()
				ch := d.waiting[m.TransactionID]
				if ch == nil {
					d.unmatched++
				}
				d.mu.Unlock()
				if ch != nil {
					select {
					case ch <- m:
					default:
					}
				}
			}
		}()
	}
	<-ctx.Done()
	d.bcast.Close()
	d.relay.Close()
	wg.Wait()
}

// dhcpClient is one machine's DHCP identity.
type dhcpClient struct {
	mac     net.HardwareAddr
	uuid    [16]byte
	arch    iana.Arch
	relayed bool
}

// lease is what an exchange got.
type lease struct {
	ip       netip.Addr
	server   net.IP
	next     netip.Addr // siaddr: the TFTP server
	bootFile string
	retries  int
}

// retransmit is the firmware's wait before sending again: 4, 8, 16, 32 s
// (PXE spec, RFC 2131 §4.1), each ±1 s, scaled by Config.DHCPTimeoutScale.
func retransmit(try int, scale float64) time.Duration {
	base := 4 * time.Second << min(try, 3)
	j := time.Duration(rand.Int64N(int64(2*time.Second))) - time.Second
	return time.Duration(float64(base+j) * scale)
}

var errDHCPTimeout = errors.New("no answer after every retransmission")

// dora runs DISCOVER→OFFER→REQUEST→ACK as firmware (ipxe false) or iPXE
// (ipxe true) and returns the ACKed lease. Each step retransmits on the
// firmware schedule until deadline.
func (d *dhcpNet) dora(ctx context.Context, c *dhcpClient, ipxe bool, scale float64, deadline time.Time) (lease, error) {
	var l lease
	xid := dhcpv4.TransactionID{}
	for i := range xid {
		xid[i] = byte(rand.IntN(256))
	}
	ch := make(chan *dhcpv4.DHCPv4, 4)
	d.mu.Lock()
	d.waiting[xid] = ch
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.waiting, xid)
		d.mu.Unlock()
	}()
	mods := []dhcpv4.Modifier{
		dhcpv4.WithTransactionID(xid),
		dhcpv4.WithHwAddr(c.mac),
		dhcpv4.WithOption(dhcpv4.OptClientArch(c.arch)),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(fmt.Sprintf("PXEClient:Arch:%05d:UNDI:002001", uint16(c.arch)))),
		dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, append([]byte{0}, c.uuid[:]...))),
		dhcpv4.WithOption(dhcpv4.OptMaxMessageSize(1472)),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
			dhcpv4.OptionBootfileName, dhcpv4.OptionTFTPServerName, dhcpv4.OptionVendorSpecificInformation),
	}
	if ipxe {
		mods = append(mods,
			dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE")),
			dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(175), []byte{0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e})))
	} else {
		mods = append(mods, dhcpv4.WithBroadcast(true))
	}
	if c.relayed {
		mods = append(mods, dhcpv4.WithGatewayIP(giaddr.AsSlice()), func(d *dhcpv4.DHCPv4) { d.HopCount = 1 })
	}
	// secs is the seconds since the client began (RFC 2131 §4.1; firmware
	// and iPXE count them, on the firmware's own clock: the scaled one
	// here), which a fleet's appliances read to decide when every one of
	// them answers (fleet.Balance).
	began := time.Now()
	send := func(m *dhcpv4.DHCPv4) error {
		m.NumSeconds = uint16(min(time.Since(began).Seconds()/max(scale, 0.001), 65535))
		if c.relayed {
			b := m.ToBytes()
			var errs []error
			for _, srv := range d.servers {
				if _, err := d.relay.WriteTo(b, srv); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
		_, err := d.bcast.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: 67})
		return err
	}
	// exchange sends m and waits for an answer of one of the types,
	// retransmitting m on the firmware schedule.
	exchange := func(m *dhcpv4.DHCPv4, want ...dhcpv4.MessageType) (*dhcpv4.DHCPv4, error) {
		for try := 0; ; try++ {
			if err := send(m); err != nil {
				return nil, err
			}
			wait := retransmit(try, scale)
			t := time.NewTimer(wait)
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					return nil, ctx.Err()
				case r := <-ch:
					if r.ClientHWAddr.String() != c.mac.String() {
						continue
					}
					for _, w := range want {
						if r.MessageType() == w {
							t.Stop()
							return r, nil
						}
					}
					continue
				case <-t.C:
				}
				break
			}
			if time.Now().After(deadline) {
				return nil, errDHCPTimeout
			}
			l.retries++
		}
	}
	disc, err := dhcpv4.New(append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover))...)
	if err != nil {
		return l, err
	}
	for {
		offer, err := exchange(disc, dhcpv4.MessageTypeOffer)
		if err != nil {
			return l, fmt.Errorf("discover: %w", err)
		}
		req, err := dhcpv4.New(append(mods,
			dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(offer.ServerIdentifier())))...)
		if err != nil {
			return l, err
		}
		ack, err := exchange(req, dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak)
		if err != nil {
			return l, fmt.Errorf("request: %w", err)
		}
		if ack.MessageType() == dhcpv4.MessageTypeNak {
			// A real client starts again at DISCOVER.
			l.retries++
			if time.Now().After(deadline) {
				return l, errors.New("request: NAKed")
			}
			continue
		}
		ip, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
		if !ok || ip.IsUnspecified() {
			return l, errors.New("ACK without an address")
		}
		l.ip, l.server = ip, ack.ServerIdentifier()
		l.next, _ = netip.AddrFromSlice(ack.ServerIPAddr.To4())
		l.bootFile = ack.BootFileName
		if l.bootFile == "" {
			l.bootFile = dhcpv4.GetString(dhcpv4.OptionBootfileName, ack.Options)
		}
		return l, nil
	}
}
