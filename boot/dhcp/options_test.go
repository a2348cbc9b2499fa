package dhcp

import (
	"bytes"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

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
