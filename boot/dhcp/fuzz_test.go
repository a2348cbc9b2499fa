package dhcp

import (
	"net"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzRespond feeds arbitrary packets to the decision function in full
// and proxy mode: it must not panic, and whatever it answers must parse,
// carry our server identifier, hand out only addresses of a range (full)
// or none at all (proxy).
func FuzzRespond(f *testing.F) {
	for i, kind := range []func(*dhcpv4.DHCPv4){biosPXE, efiPXE, ipxeClient, httpClient, plain} {
		d := discover(f, mac(i), kind)
		f.Add(d.ToBytes(), false)
		f.Add(d.ToBytes(), true)
		req, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac(i)),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, byte(100+i)))))
		kind(req)
		f.Add(req.ToBytes(), false)
	}
	relayed := discover(f, mac(9), biosPXE, dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)))
	f.Add(relayed.ToBytes(), false)
	// The request states and DECLINE (spoof_test.go), local and relayed.
	for _, m := range []*dhcpv4.DHCPv4{
		initReboot(mac(10), net.IPv4(10, 0, 0, 120)),
		renew(mac(11), net.IPv4(10, 0, 0, 121)),
		selecting(mac(12), net.IPv4(10, 0, 0, 122)),
		decline(mac(13), net.IPv4(10, 0, 0, 123)),
		decline(mac(14), net.IPv4(10, 9, 0, 100), dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))),
	} {
		f.Add(m.ToBytes(), false)
	}
	full := newFixture(f, ModeFull)
	proxy := newFixture(f, ModeProxy, func(c *Config) { c.Ranges = nil; c.Store = nil })
	f.Fuzz(func(t *testing.T, b []byte, isProxy bool) {
		m, err := dhcpv4.FromBytes(b)
		if err != nil {
			return
		}
		fx := full
		if isProxy {
			fx = proxy
		}
		for _, port := range []int{dhcpv4.ServerPort, PXEPort} {
			rep, dst := fx.s.Respond(fx.ctx, m, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 50), Port: 68}, port)
			if rep == nil {
				continue
			}
			if dst == nil {
				t.Fatal("reply without destination")
			}
			back, err := dhcpv4.FromBytes(rep.ToBytes())
			if err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if !back.ServerIdentifier().Equal(net.IP(serverIP.AsSlice())) {
				t.Fatalf("server id %v", back.ServerIdentifier())
			}
			yi := addrOf(back.YourIPAddr)
			switch {
			case isProxy && yi.IsValid():
				t.Fatalf("proxy handed out %s", yi)
			case !isProxy && yi.IsValid() && !localRange().Contains(yi) && !relayRange().Contains(yi):
				t.Fatalf("full mode handed out %s outside every range", yi)
			}
		}
	})
}
