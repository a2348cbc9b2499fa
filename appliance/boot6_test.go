package appliance

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/boot/dhcp6"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// The plain-HTTP script rule holds per address family: an IPv6 source
// holds the DHCPv6 lease on its address, an IPv4 source with only DHCPv6
// leasing is not held to any, an IPv6 source with only DHCPv4 leasing
// holds none.
func TestStoreLeasesBothFamilies(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	now := time.Unix(1e9, 0)
	put := func(prefix, ip, mac string) {
		l := &bootv1.Lease{Ip: ip, Mac: mac, State: bootv1.Lease_STATE_ACTIVE, ExpiresUnix: now.Add(time.Hour).Unix()}
		if _, err := record.Put(ctx, st, prefix+ip, l, 0); err != nil {
			t.Fatal(err)
		}
	}
	put(dhcp6.LeasePrefix, "fd00:c0::100", "52:54:00:00:00:06")
	put(dhcp.LeasePrefix, "10.0.0.100", "52:54:00:00:00:04")
	clock := func() time.Time { return now }
	for name, tc := range map[string]struct {
		l      storeLeases
		addr   string
		mac    string
		ok     bool
		noRule bool
	}{
		"v6 lease":               {storeLeases{st: st, now: clock, v6: true}, "fd00:c0::100", "52:54:00:00:00:06", true, false},
		"v6 no lease":            {storeLeases{st: st, now: clock, v6: true}, "fd00:c0::101", "", false, false},
		"v4 with only v6 leased": {storeLeases{st: st, now: clock, v6: true}, "10.0.0.100", "", false, true},
		"v6 with only v4 leased": {storeLeases{st: st, now: clock, v4: true}, "fd00:c0::100", "", false, false},
		"v4 dual stack":          {storeLeases{st: st, now: clock, v4: true, v6: true}, "10.0.0.100", "52:54:00:00:00:04", true, false},
	} {
		mac, ok, err := tc.l.LeaseHolder(ctx, netip.MustParseAddr(tc.addr))
		if errors.Is(err, boothttp.ErrNoLeaseRule) != tc.noRule || (err != nil && !tc.noRule) || mac != tc.mac || ok != tc.ok {
			t.Errorf("%s: LeaseHolder = %q %v %v", name, mac, ok, err)
		}
	}
}

func TestParseRanges6(t *testing.T) {
	ip := netip.MustParseAddr("fd00:c0::1")
	rs, err := parseRanges6(BootConfig{DHCP6Range: "fd00:c0::100-fd00:c0::1ff", DHCP6DNS: []string{"fd00:c0::53"},
		DHCP6RelayRanges: []string{"fd00:9::/64=fd00:9::100-fd00:9::1ff"}}, ip)
	if err != nil || len(rs) != 2 || rs[0].Prefix != netip.MustParsePrefix("fd00:c0::/64") || !rs[1].Relayed || len(rs[0].DNS) != 1 {
		t.Fatalf("%+v %v", rs, err)
	}
	for _, bad := range []BootConfig{
		{DHCP6Range: "10.0.0.1-10.0.0.9"},
		{DHCP6Range: "fd00:c0::1-fd00:c0::9"}, // holds the appliance
		{DHCP6Range: "fd00:c0::100-fd00:c0::1ff/200"},
		{DHCP6Range: "fd00:c0::100-fd00:c0::1ff", DHCP6RelayRanges: []string{"fd00:c0::/48=fd00:c0::300-fd00:c0::3ff"}},
		{DHCP6Range: "fd00:c0::100-fd00:c0::1ff", DHCP6DNS: []string{"10.0.0.53"}},
	} {
		if _, err := parseRanges6(bad, ip); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestParseRelayFrom6(t *testing.T) {
	got, err := parseRelayFrom6([]string{"fd00:9::1", " fd00:a::/48 "})
	if err != nil || len(got) != 2 || got[0].String() != "fd00:9::1/128" || got[1].String() != "fd00:a::/48" {
		t.Fatalf("parseRelayFrom6: %v %v", got, err)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.0/8", "::ffff:10.0.0.1", "nonsense"} {
		if _, err := parseRelayFrom6([]string{bad}); err == nil {
			t.Errorf("--dhcp6-relay-from %q accepted", bad)
		}
	}
}
