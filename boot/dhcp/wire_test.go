package dhcp

import (
	"bytes"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"
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

// FuzzParsePacket: parsePacket decodes exactly what dhcpv4.FromBytes
// decodes, and refuses exactly what it refuses.
func FuzzParsePacket(f *testing.F) {
	for i, kind := range []func(*dhcpv4.DHCPv4){biosPXE, efiPXE, ipxeClient, httpClient, plain} {
		d := discover(f, mac(i), kind, dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)))
		d.BootFileName, d.ServerHostName = "file", "server"
		f.Add(d.ToBytes())
	}
	d := discover(f, mac(7), plain)
	d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionHostName, bytes.Repeat([]byte{'h'}, 600))) // split in three
	d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(200), nil))
	b := d.ToBytes()
	f.Add(b)
	f.Add(b[:240])
	f.Add(b[:100])
	f.Add(append(b[:len(b):len(b)], 255))
	f.Fuzz(func(t *testing.T, b []byte) {
		want, werr := dhcpv4.FromBytes(b)
		in := append([]byte(nil), b...)
		got, gerr := parsePacket(in)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("error %v, FromBytes's %v", gerr, werr)
		}
		if werr != nil {
			return
		}
		clear(in) // the result must not share the input's memory
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("parsePacket differs from FromBytes (-want +got):\n%s", diff)
		}
	})
}

// TestOptionReaders: messageType and optAddr read options as the library's
// MessageType and GetIP (with addrOf) do, for every length.
func TestOptionReaders(t *testing.T) {
	for name, v := range map[string][]byte{
		"absent": nil, "empty": {}, "one byte": {3}, "two bytes": {3, 1}, "four bytes": {10, 0, 0, 7},
		"unspecified": {0, 0, 0, 0}, "five bytes": {10, 0, 0, 7, 1}, "sixteen bytes": bytes.Repeat([]byte{1}, 16),
	} {
		t.Run(name, func(t *testing.T) {
			m, _ := dhcpv4.New()
			m.Options = dhcpv4.Options{}
			if name != "absent" {
				m.Options[dhcpv4.OptionDHCPMessageType.Code()] = v
				m.Options[dhcpv4.OptionRequestedIPAddress.Code()] = v
			}
			if got, want := messageType(m), m.MessageType(); got != want {
				t.Errorf("messageType %v, MessageType %v", got, want)
			}
			if got, want := optAddr(m, dhcpv4.OptionRequestedIPAddress), addrOf(m.RequestedIPAddress()); got != want {
				t.Errorf("optAddr %v, addrOf(RequestedIPAddress) %v", got, want)
			}
		})
	}
}
