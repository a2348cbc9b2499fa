package dhcp6

import (
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

// FuzzRespond feeds arbitrary datagrams to the decision function, direct
// and from a relay: it must not panic, and whatever it answers must parse,
// carry our server DUID, and hand out only addresses of a range.
func FuzzRespond(f *testing.F) {
	sid := dhcpv6.OptServerID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: []byte{2, 0, 0, 0, 0, 1}})
	for i, kind := range []func(*dhcpv6.Message){pxe6, http6, ipxe6, plain6} {
		id := duid(mac(i))
		for _, m := range []*dhcpv6.Message{
			msg(f, dhcpv6.MessageTypeSolicit, id, kind, ia(1)),
			msg(f, dhcpv6.MessageTypeSolicit, id, kind, ia(1), &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit}),
			msg(f, dhcpv6.MessageTypeRequest, id, kind, ia(1, netip.MustParseAddr("fd00:c0::100")), sid),
			msg(f, dhcpv6.MessageTypeRenew, id, kind, ia(1, netip.MustParseAddr("fd00:c0::100")), sid),
			msg(f, dhcpv6.MessageTypeRebind, id, kind, ia(1, netip.MustParseAddr("2001:db8::1"))),
			msg(f, dhcpv6.MessageTypeRelease, id, kind, ia(1, netip.MustParseAddr("fd00:c0::100")), sid),
			msg(f, dhcpv6.MessageTypeDecline, id, kind, ia(1, netip.MustParseAddr("fd00:c0::100")), sid),
			msg(f, dhcpv6.MessageTypeConfirm, id, kind, ia(1, netip.MustParseAddr("fd00:c0::100"))),
			msg(f, dhcpv6.MessageTypeInformationRequest, nil, kind),
		} {
			f.Add(m.ToBytes(), false)
			f.Add(relayed(f, m, 0, "fd00:99::1", dhcpv6.OptInterfaceID([]byte("i")),
				dhcpv6.OptClientLinkLayerAddress(iana.HWTypeEthernet, mac(i))).ToBytes(), true)
		}
	}
	f.Add(nest(f, msg(f, dhcpv6.MessageTypeSolicit, duid(mac(1)), pxe6, ia(1)), 9).ToBytes(), true)
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, b []byte, viaRelay bool) {
		peer := clientPeer
		if viaRelay {
			peer = netip.MustParseAddrPort("[fd00:99::1]:547")
		}
		out, dst, ok := fx.s.Respond(fx.ctx, b, peer)
		if !ok {
			return
		}
		if dst != peer {
			t.Fatalf("reply to %s", dst)
		}
		d, err := dhcpv6.FromBytes(out)
		if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		for d.IsRelay() {
			if d = d.(*dhcpv6.RelayMessage).Options.RelayMessage(); d == nil {
				t.Fatal("Relay-Reply without a message")
			}
		}
		m := d.(*dhcpv6.Message)
		if s := m.Options.ServerID(); s == nil || !s.Equal(fx.s.duid) {
			t.Fatalf("server id %v", s)
		}
		for _, i := range m.Options.IANA() {
			for _, a := range i.Options.Addresses() {
				ip, _ := netip.AddrFromSlice(a.IPv6Addr)
				if a.ValidLifetime > 0 && !localRange().Contains(ip) && !relayRange().Contains(ip) {
					t.Fatalf("handed out %s outside every range", ip)
				}
			}
		}
	})
}
