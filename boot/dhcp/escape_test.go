package dhcp

import (
	"net"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Options 60 and 77 reach the timeline with their control characters
// escaped; the vendor class still selects the boot path as sent.
func TestClientAttrsEscapeOptions(t *testing.T) {
	hw, _ := net.ParseMAC("52:54:00:00:0e:01")
	m, err := dhcpv4.NewDiscovery(hw,
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient\x1b]0;owned\x07")),
		dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE\x1b[2J\u202e")))
	if err != nil {
		t.Fatal(err)
	}
	c := Classify(m)
	if !c.PXE {
		t.Fatal("the vendor class no longer selects PXE")
	}
	a := clientAttrs(c, m)
	for k, v := range a {
		if strings.ContainsAny(v, "\x1b\x07\u202e") {
			t.Errorf("%s = %q holds control characters", k, v)
		}
	}
	if a["vendor_class"] != `PXEClient\x1b]0;owned\x07` || !strings.Contains(a["user_class"], `\x1b[2J\u202e`) {
		t.Errorf("attrs %q", a)
	}
}
