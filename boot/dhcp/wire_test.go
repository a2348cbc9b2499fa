package dhcp

import (
	"bytes"
	"net"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzAppendPacket: appendPacket writes exactly what the library's
// ToBytes writes, for any packet the library parses.
func FuzzAppendPacket(f *testing.F) {
	for i, kind := range []func(*dhcpv4.DHCPv4){biosPXE, efiPXE, ipxeClient, httpClient, plain} {
		d := discover(f, mac(i), kind, dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)))
		f.Add(d.ToBytes())
	}
	long := discover(f, mac(7), plain)
	long.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionRelayAgentInformation, bytes.Repeat([]byte{1}, 300)))
	long.UpdateOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(200), nil))
	long.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionHostName, bytes.Repeat([]byte{'h'}, 600)))
	long.BootFileName = string(bytes.Repeat([]byte{'f'}, 200))
	long.ServerHostName = string(bytes.Repeat([]byte{'s'}, 100))
	f.Add(long.ToBytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := dhcpv4.FromBytes(b)
		if err != nil {
			return
		}
		want := m.ToBytes()
		if got := appendPacket([]byte("prefix"), m); !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
			t.Fatalf("appendPacket differs from ToBytes:\n got %x\nwant %x", got[6:], want)
		}
	})
}
