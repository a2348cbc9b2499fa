package appliance

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/corralhq/corral/boot/dhcp"
)

func TestParseRanges(t *testing.T) {
	sip := netip.MustParseAddr("10.0.0.1")
	for name, tc := range map[string]struct {
		bc      BootConfig
		mode    dhcp.Mode
		want    []string // Range.String() of each
		routers int
		err     string
	}{
		"full with bits": {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24", DHCPRouter: []string{"10.0.0.254"}, DHCPDNS: []string{"10.0.0.53"}},
			mode: dhcp.ModeFull, want: []string{"10.0.0.100-10.0.0.199 (10.0.0.0/24)"}, routers: 1},
		"subnet from the interface": {bc: BootConfig{Interface: "lo", DHCPRange: "127.0.0.100-127.0.0.199"}, mode: dhcp.ModeFull,
			want: []string{"127.0.0.100-127.0.0.199 (127.0.0.0/8)"}},
		"relay ranges": {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24",
			DHCPRelayRanges: []string{"10.9.0.0/24=10.9.0.100-10.9.0.200@10.9.0.1", "10.8.0.0/16=10.8.1.0-10.8.1.255"}}, mode: dhcp.ModeFull,
			want: []string{"10.0.0.100-10.0.0.199 (10.0.0.0/24)", "10.9.0.100-10.9.0.200 (10.9.0.0/24)", "10.8.1.0-10.8.1.255 (10.8.0.0/16)"}},
		"proxy needs no range":     {mode: dhcp.ModeProxy},
		"full needs a range":       {mode: dhcp.ModeFull, err: "needs --dhcp-range"},
		"range in proxy mode":      {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24"}, mode: dhcp.ModeProxy, err: "need --dhcp-mode full"},
		"malformed range":          {bc: BootConfig{DHCPRange: "10.0.0.100"}, mode: dhcp.ModeFull, err: "want START-END"},
		"reversed range":           {bc: BootConfig{DHCPRange: "10.0.0.199-10.0.0.100/24"}, mode: dhcp.ModeFull, err: "start <= end"},
		"range outside its subnet": {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.1.10/24"}, mode: dhcp.ModeFull, err: "inside the subnet"},
		"range holds the server":   {bc: BootConfig{DHCPRange: "10.0.0.1-10.0.0.10/24"}, mode: dhcp.ModeFull, err: "own address"},
		"bad router":               {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24", DHCPRouter: []string{"gw"}}, mode: dhcp.ModeFull, err: "--dhcp-router"},
		"bad relay range": {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24", DHCPRelayRanges: []string{"10.9.0.100-10.9.0.200"}},
			mode: dhcp.ModeFull, err: "SUBNET=START-END"},
		"overlapping relay range": {bc: BootConfig{DHCPRange: "10.0.0.100-10.0.0.199/24", DHCPRelayRanges: []string{"10.0.0.0/16=10.0.5.1-10.0.5.9"}},
			mode: dhcp.ModeFull, err: "overlaps"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseRanges(tc.bc, tc.mode, sip)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i, r := range got {
				if r.String() != tc.want[i] || r.Relayed != (i > 0) {
					t.Errorf("range %d = %s relayed=%v, want %s", i, r, r.Relayed, tc.want[i])
				}
			}
			if tc.routers > 0 && len(got[0].Router) != tc.routers {
				t.Errorf("routers %v", got[0].Router)
			}
		})
	}
}

func TestBootOffByDefault(t *testing.T) {
	srv, _ := startServer(t, t.TempDir())
	for _, c := range srv.components {
		switch c.name {
		case "dhcp", "tftp", "boot-http", "ra":
			t.Errorf("component %s runs without --boot-interface", c.name)
		}
	}
}
