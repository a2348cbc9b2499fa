package pool

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestApplyNetworkCreates(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	req := &poolv1.ApplyNetworkRequest{
		Name:        "lan",
		Annotations: map[string]string{"a": "b"},
		Labels:      map[string]string{"env": "lab"},
		Ipv4Cidr:    "10.0.0.0/24",
		Ipv6Cidr:    "fd00:1::/64",
		Domain:      "lab.example",
		Ipv4Gateway: "10.0.0.1",
		Ipv6Gateway: "fd00:1::1",
		DnsServers:  []string{"10.0.0.53", "fd00:1::53", "9.9.9.9"},
		VlanId:      42,
	}
	want := &poolv1.Network{
		Name:        "lan",
		Annotations: map[string]string{"a": "b"},
		Labels:      map[string]string{"env": "lab"},
		Ipv4Cidr:    "10.0.0.0/24",
		Ipv6Cidr:    "fd00:1::/64",
		Domain:      "lab.example",
		Ipv4Gateway: "10.0.0.1",
		Ipv6Gateway: "fd00:1::1",
		DnsServers:  []string{"10.0.0.53", "fd00:1::53", "9.9.9.9"},
		VlanId:      42,
		State:       poolv1.Network_AVAILABLE,
	}
	got := e.applyNetwork(t, req)
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("ApplyNetwork returned (-want +got):\n%s", diff)
	}
	stored, err := e.p.GetNetwork(ctx, "lan")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, stored, protocmp.Transform()); diff != "" {
		t.Errorf("GetNetwork (-want +got):\n%s", diff)
	}

	// Re-applying keeps reservations and may change the gateway, DNS and
	// labels.
	nic := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm1-0"})
	req.Ipv4Gateway = "10.0.0.254"
	req.DnsServers = nil
	req.Labels = nil
	got = e.applyNetwork(t, req)
	want.Ipv4Gateway = "10.0.0.254"
	want.DnsServers = nil
	want.Labels = nil
	want.ReservedNetworkInterfaces = map[string]*poolv1.NetworkInterface{"vm1-0": nic}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("re-applied network (-want +got):\n%s", diff)
	}
}

// TestApplyNetworkCanonical: CIDRs and addresses are stored in canonical
// form, so re-applying the same prefix spelt differently is not a change.
func TestApplyNetworkCanonical(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	got := e.applyNetwork(t, &poolv1.ApplyNetworkRequest{
		Name: "v6", Ipv6Cidr: "FD00:0:0:0::/64", Ipv6Gateway: "FD00::0:1", DnsServers: []string{"FD00::53"},
	})
	if got.GetIpv6Cidr() != "fd00::/64" || got.GetIpv6Gateway() != "fd00::1" || got.GetDnsServers()[0] != "fd00::53" {
		t.Errorf("stored %q %q %q, want canonical fd00::/64 fd00::1 fd00::53", got.GetIpv6Cidr(), got.GetIpv6Gateway(), got.GetDnsServers())
	}
	if _, err := e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "v6", Ipv6Cidr: "fd00::/64"}); err != nil {
		t.Errorf("re-apply in canonical form: %v", err)
	}
	if _, err := e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "v6", Ipv6Cidr: "fd00:0000::/64"}); err != nil {
		t.Errorf("re-apply in another spelling: %v", err)
	}
}

func TestApplyNetworkVLAN(t *testing.T) {
	tests := map[string]struct {
		vlan    uint32
		ann     string // value of the n0stack annotation; "" = absent
		want    uint32
		wantErr error
	}{
		"none":                       {},
		"field":                      {vlan: 200, want: 200},
		"annotation":                 {ann: "100", want: 100},
		"field and same annotation":  {vlan: 100, ann: "100", want: 100},
		"field max":                  {vlan: 4094, want: 4094},
		"field 4095":                 {vlan: 4095, wantErr: apierr.ErrInvalid},
		"field 5000":                 {vlan: 5000, wantErr: apierr.ErrInvalid},
		"annotation 5000":            {ann: "5000", wantErr: apierr.ErrInvalid},
		"annotation not a number":    {ann: "ten", wantErr: apierr.ErrInvalid},
		"annotation negative":        {ann: "-1", wantErr: apierr.ErrInvalid},
		"annotation huge":            {ann: "99999999999", wantErr: apierr.ErrInvalid},
		"field and bad annotation":   {vlan: 100, ann: "ten", wantErr: apierr.ErrInvalid},
		"field and other annotation": {vlan: 100, ann: "200", wantErr: apierr.ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			req := &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/24", VlanId: tc.vlan}
			if tc.ann != "" {
				req.Annotations = map[string]string{AnnotationVLANID: tc.ann}
			}
			before := e.snapshot(t)
			got, err := e.p.ApplyNetwork(context.Background(), req)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				e.assertUnchanged(t, before)
				return
			}
			if got.GetVlanId() != tc.want {
				t.Errorf("vlan_id = %d, want %d", got.GetVlanId(), tc.want)
			}
		})
	}
}

func TestApplyNetworkBadInput(t *testing.T) {
	type req = poolv1.ApplyNetworkRequest
	tests := map[string]struct {
		req     *req
		wantErr error
		wantMsg []string
	}{
		"no cidr":                {req: &req{}, wantErr: apierr.ErrInvalid},
		"v4 prefix 33":           {req: &req{Ipv4Cidr: "10.0.0.0/33"}, wantErr: apierr.ErrInvalid},
		"v4 garbage":             {req: &req{Ipv4Cidr: "garbage"}, wantErr: apierr.ErrInvalid},
		"v4 no length":           {req: &req{Ipv4Cidr: "10.0.0.0"}, wantErr: apierr.ErrInvalid},
		"v4 leading zero length": {req: &req{Ipv4Cidr: "10.0.0.0/024"}, wantErr: apierr.ErrInvalid},
		"v4 leading zero octet":  {req: &req{Ipv4Cidr: "010.0.0.0/24"}, wantErr: apierr.ErrInvalid},
		"v4 host bits set":       {req: &req{Ipv4Cidr: "10.0.0.5/24"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"10.0.0.0/24"}},
		"v4 given ipv6":          {req: &req{Ipv4Cidr: "fd00::/64"}, wantErr: apierr.ErrInvalid},
		"v4 given mapped":        {req: &req{Ipv4Cidr: "::ffff:10.0.0.0/120"}, wantErr: apierr.ErrInvalid},
		"v4 /31":                 {req: &req{Ipv4Cidr: "10.0.0.0/31"}, wantErr: apierr.ErrInvalid},
		"v4 /32":                 {req: &req{Ipv4Cidr: "10.0.0.0/32"}, wantErr: apierr.ErrInvalid},
		"v4 spaces":              {req: &req{Ipv4Cidr: " 10.0.0.0/24"}, wantErr: apierr.ErrInvalid},
		"v6 given ipv4":          {req: &req{Ipv6Cidr: "10.0.0.0/24"}, wantErr: apierr.ErrInvalid},
		"v6 host bits set":       {req: &req{Ipv6Cidr: "fd00::1/64"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"fd00::/64"}},
		"v6 /127":                {req: &req{Ipv6Cidr: "fd00::/127"}, wantErr: apierr.ErrInvalid},
		"v6 /129":                {req: &req{Ipv6Cidr: "fd00::/129"}, wantErr: apierr.ErrInvalid},
		"v6 zone":                {req: &req{Ipv6Cidr: "fe80::%eth0/64"}, wantErr: apierr.ErrInvalid},
		"v6 mapped":              {req: &req{Ipv6Cidr: "::ffff:10.0.0.0/120"}, wantErr: apierr.ErrInvalid},
		"gw outside":             {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.1.1"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"outside"}},
		"gw network address":     {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.0"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"network address"}},
		"gw broadcast":           {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.255"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"broadcast"}},
		"gw not an ip":           {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "router"}, wantErr: apierr.ErrInvalid},
		"gw with prefix":         {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.1/24"}, wantErr: apierr.ErrInvalid},
		"gw is ipv6":             {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "fd00::1"}, wantErr: apierr.ErrInvalid},
		"gw without v4 cidr":     {req: &req{Ipv6Cidr: "fd00::/64", Ipv4Gateway: "10.0.0.1"}, wantErr: apierr.ErrInvalid},
		"gw6 outside":            {req: &req{Ipv6Cidr: "fd00::/64", Ipv6Gateway: "fd01::1"}, wantErr: apierr.ErrInvalid},
		"gw6 subnet anycast":     {req: &req{Ipv6Cidr: "fd00::/64", Ipv6Gateway: "fd00::"}, wantErr: apierr.ErrInvalid},
		"gw6 is ipv4":            {req: &req{Ipv6Cidr: "fd00::/64", Ipv6Gateway: "10.0.0.1"}, wantErr: apierr.ErrInvalid},
		"gw6 without v6 cidr":    {req: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Gateway: "fd00::1"}, wantErr: apierr.ErrInvalid},
		"dns not an ip":          {req: &req{Ipv4Cidr: "10.0.0.0/24", DnsServers: []string{"1.1.1.1", "dns.example"}}, wantErr: apierr.ErrInvalid},
		"dns with port":          {req: &req{Ipv4Cidr: "10.0.0.0/24", DnsServers: []string{"8.8.8.8:53"}}, wantErr: apierr.ErrInvalid},
		"dns empty":              {req: &req{Ipv4Cidr: "10.0.0.0/24", DnsServers: []string{""}}, wantErr: apierr.ErrInvalid},
		"dns with zone":          {req: &req{Ipv4Cidr: "10.0.0.0/24", DnsServers: []string{"fe80::1%eth0"}}, wantErr: apierr.ErrInvalid},
		"vlan 5000":              {req: &req{Ipv4Cidr: "10.0.0.0/24", VlanId: 5000}, wantErr: apierr.ErrInvalid},
		"vlan annotation NaN":    {req: &req{Ipv4Cidr: "10.0.0.0/24", Annotations: map[string]string{AnnotationVLANID: "x"}}, wantErr: apierr.ErrInvalid},
		"label key with space":   {req: &req{Ipv4Cidr: "10.0.0.0/24", Labels: map[string]string{"a b": ""}}, wantErr: apierr.ErrInvalid},
		"annotation key empty":   {req: &req{Ipv4Cidr: "10.0.0.0/24", Annotations: map[string]string{"": ""}}, wantErr: apierr.ErrInvalid},
		"overlaps existing":      {req: &req{Ipv4Cidr: "10.1.0.128/25"}, wantErr: apierr.ErrPrecondition, wantMsg: []string{`"existing"`}},
		"overlaps existing v6":   {req: &req{Ipv6Cidr: "fd10::/16"}, wantErr: apierr.ErrPrecondition, wantMsg: []string{`"existing"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "existing", Ipv4Cidr: "10.1.0.0/24", Ipv6Cidr: "fd10::/64"})
			e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "existing", NetworkInterfaceName: "eth0"})
			before := e.snapshot(t)
			tc.req.Name = "new"
			_, err := e.p.ApplyNetwork(context.Background(), tc.req)
			wantErr(t, err, tc.wantErr)
			wantContains(t, err, tc.wantMsg...)
			e.assertUnchanged(t, before)
			_, err = e.p.GetNetwork(context.Background(), "new")
			wantErr(t, err, apierr.ErrNotFound)
		})
	}
}

func TestApplyNetworkOverlap(t *testing.T) {
	type req = poolv1.ApplyNetworkRequest
	tests := map[string]struct {
		first, second *req
		wantErr       error
	}{
		"v4 /16 then /24 inside":   {first: &req{Ipv4Cidr: "10.0.0.0/16"}, second: &req{Ipv4Cidr: "10.0.1.0/24"}, wantErr: apierr.ErrPrecondition},
		"v4 /24 then /16 around":   {first: &req{Ipv4Cidr: "10.0.1.0/24"}, second: &req{Ipv4Cidr: "10.0.0.0/16"}, wantErr: apierr.ErrPrecondition},
		"v4 same":                  {first: &req{Ipv4Cidr: "10.0.0.0/24"}, second: &req{Ipv4Cidr: "10.0.0.0/24"}, wantErr: apierr.ErrPrecondition},
		"v4 everything":            {first: &req{Ipv4Cidr: "192.168.7.0/24"}, second: &req{Ipv4Cidr: "0.0.0.0/0"}, wantErr: apierr.ErrPrecondition},
		"v4 adjacent":              {first: &req{Ipv4Cidr: "10.0.0.0/24"}, second: &req{Ipv4Cidr: "10.0.1.0/24"}},
		"v4 adjacent other side":   {first: &req{Ipv4Cidr: "10.0.1.0/24"}, second: &req{Ipv4Cidr: "10.0.0.0/24"}},
		"v6 /48 then /64 inside":   {first: &req{Ipv6Cidr: "fd00::/48"}, second: &req{Ipv6Cidr: "fd00:0:0:1::/64"}, wantErr: apierr.ErrPrecondition},
		"v6 /64 then /48 around":   {first: &req{Ipv6Cidr: "fd00:0:0:1::/64"}, second: &req{Ipv6Cidr: "fd00::/48"}, wantErr: apierr.ErrPrecondition},
		"v6 same":                  {first: &req{Ipv6Cidr: "fd00::/64"}, second: &req{Ipv6Cidr: "fd00::/64"}, wantErr: apierr.ErrPrecondition},
		"v6 adjacent":              {first: &req{Ipv6Cidr: "fd00::/64"}, second: &req{Ipv6Cidr: "fd00:0:0:1::/64"}},
		"v6 overlap, v4 disjoint":  {first: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"}, second: &req{Ipv4Cidr: "10.1.0.0/24", Ipv6Cidr: "fd00::/56"}, wantErr: apierr.ErrPrecondition},
		"v4 overlap, v6 disjoint":  {first: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"}, second: &req{Ipv4Cidr: "10.0.0.0/25", Ipv6Cidr: "fd01::/64"}, wantErr: apierr.ErrPrecondition},
		"v4 only and v6 only":      {first: &req{Ipv4Cidr: "10.0.0.0/8"}, second: &req{Ipv6Cidr: "fd00::/8"}},
		"different families share": {first: &req{Ipv4Cidr: "10.0.0.0/8", Ipv6Cidr: "fd00::/64"}, second: &req{Ipv4Cidr: "11.0.0.0/8"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			tc.first.Name, tc.second.Name = "first", "second"
			e.applyNetwork(t, tc.first)
			before := e.snapshot(t)
			_, err := e.p.ApplyNetwork(ctx, tc.second)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				wantContains(t, err, `"first"`, "overlaps")
				e.assertUnchanged(t, before)
				// Once the first is gone, the second fits.
				if err := e.p.DeleteNetwork(ctx, "first"); err != nil {
					t.Fatal(err)
				}
				e.applyNetwork(t, tc.second)
			}
			nets, _ := e.p.ListNetworks(ctx)
			if len(nets) == 0 {
				t.Fatal("no networks")
			}
		})
	}
}

// TestApplyNetworkStaleClaim covers a writer that claimed CIDRs in the index
// and died before writing its network: the claim blocks overlapping
// networks for a minute, then is taken over.
func TestApplyNetworkStaleClaim(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	spec, err := parseNetSpec(&poolv1.ApplyNetworkRequest{Name: "ghost", Ipv4Cidr: "10.0.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.claimCIDRs(ctx, "ghost", spec); err != nil {
		t.Fatal(err)
	}
	req := &poolv1.ApplyNetworkRequest{Name: "real", Ipv4Cidr: "10.0.5.0/24"}
	_, err = e.p.ApplyNetwork(ctx, req)
	wantErr(t, err, apierr.ErrPrecondition)
	e.clock.Set(t0.Add(claimStale - time.Second))
	_, err = e.p.ApplyNetwork(ctx, req)
	wantErr(t, err, apierr.ErrPrecondition)
	e.clock.Set(t0.Add(claimStale + time.Second))
	e.applyNetwork(t, req)
	// The ghost is gone from the index, and the real network holds the range.
	_, err = e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "ghost", Ipv4Cidr: "10.0.0.0/16"})
	wantErr(t, err, apierr.ErrPrecondition)
	// A live network's claim never goes stale, however old.
	e.clock.Set(t0.Add(24 * time.Hour))
	_, err = e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "late", Ipv4Cidr: "10.0.5.0/25"})
	wantErr(t, err, apierr.ErrPrecondition)
}

// TestApplyNetworkMissingIndexEntry: a network record whose index entry is
// missing (e.g. lost to a DeleteNetwork racing a re-create of the same name)
// still blocks overlapping networks.
func TestApplyNetworkMissingIndexEntry(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "a", Ipv4Cidr: "10.0.0.0/24"})
	if err := e.p.unclaimCIDRs(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	_, err := e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "b", Ipv4Cidr: "10.0.0.0/16"})
	wantErr(t, err, apierr.ErrPrecondition)
	// Re-applying a restores its claim.
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "a", Ipv4Cidr: "10.0.0.0/24"})
	_, err = e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "b", Ipv4Cidr: "10.0.0.0/16"})
	wantErr(t, err, apierr.ErrPrecondition)
}

func TestApplyNetworkChange(t *testing.T) {
	type req = poolv1.ApplyNetworkRequest
	tests := map[string]struct {
		second  *req
		wantErr error
		wantMsg []string
	}{
		"change v4":                {second: &req{Ipv4Cidr: "10.0.1.0/24", Ipv6Cidr: "fd00::/64"}, wantErr: apierr.ErrPrecondition, wantMsg: []string{"cannot change"}},
		"grow v4":                  {second: &req{Ipv4Cidr: "10.0.0.0/23", Ipv6Cidr: "fd00::/64"}, wantErr: apierr.ErrPrecondition},
		"change v6":                {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd01::/64"}, wantErr: apierr.ErrPrecondition},
		"drop v4":                  {second: &req{Ipv6Cidr: "fd00::/64"}, wantErr: apierr.ErrPrecondition},
		"drop v6":                  {second: &req{Ipv4Cidr: "10.0.0.0/24"}, wantErr: apierr.ErrPrecondition},
		"change v4 onto other net": {second: &req{Ipv4Cidr: "10.9.0.0/24", Ipv6Cidr: "fd00::/64"}, wantErr: apierr.ErrPrecondition},
		"gateway on a reservation": {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64", Ipv4Gateway: "10.0.0.1"}, wantErr: apierr.ErrPrecondition, wantMsg: []string{`"eth0"`}},
		"gw6 on a reservation":     {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64", Ipv6Gateway: "fd00::1"}, wantErr: apierr.ErrPrecondition, wantMsg: []string{`"eth0"`}},
		"same":                     {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"}},
		"new gateway":              {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64", Ipv4Gateway: "10.0.0.254", Ipv6Gateway: "fd00::ffff"}},
		"domain and dns":           {second: &req{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64", Domain: "x.example", DnsServers: []string{"10.0.0.2"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			e.applyNetwork(t, &req{Name: "lan", Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"})
			e.applyNetwork(t, &req{Name: "other", Ipv4Cidr: "10.9.0.0/24"})
			// eth0 gets 10.0.0.1 and fd00::1 (the /64 address is EUI-64,
			// so ask for it).
			e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "eth0", Ipv6Address: "fd00::1"})
			before := e.snapshot(t)
			tc.second.Name = "lan"
			got, err := e.p.ApplyNetwork(ctx, tc.second)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				wantContains(t, err, tc.wantMsg...)
				e.assertUnchanged(t, before)
				return
			}
			if len(got.GetReservedNetworkInterfaces()) != 1 {
				t.Errorf("reservations lost: %v", got.GetReservedNetworkInterfaces())
			}
		})
	}
	t.Run("add v6 to a v4 network", func(t *testing.T) {
		e := newEnv(t)
		e.applyNetwork(t, &req{Name: "lan", Ipv4Cidr: "10.0.0.0/24"})
		e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "eth0"})
		got := e.applyNetwork(t, &req{Name: "lan", Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"})
		if got.GetIpv6Cidr() != "fd00::/64" || len(got.GetReservedNetworkInterfaces()) != 1 {
			t.Errorf("got %v", got)
		}
		// The added range is claimed.
		_, err := e.p.ApplyNetwork(context.Background(), &req{Name: "x", Ipv6Cidr: "fd00::/60"})
		wantErr(t, err, apierr.ErrPrecondition)
	})
}

func TestNetworkListGetMissing(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	got, err := e.p.ListNetworks(ctx)
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("ListNetworks on an empty pool = %#v, %v; want an empty non-nil slice", got, err)
	}
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "b", Ipv4Cidr: "10.1.0.0/24"})
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "a", Ipv4Cidr: "10.0.0.0/24"})
	got, err = e.p.ListNetworks(ctx)
	if err != nil || len(got) != 2 || got[0].GetName() != "a" || got[1].GetName() != "b" {
		t.Fatalf("ListNetworks = %v, %v; want a, b", got, err)
	}
	before := e.snapshot(t)
	_, err = e.p.GetNetwork(ctx, "missing")
	wantErr(t, err, apierr.ErrNotFound)
	wantErr(t, e.p.DeleteNetwork(ctx, "missing"), apierr.ErrNotFound)
	wantErr(t, e.p.ReleaseNetworkInterface(ctx, "missing", "eth0"), apierr.ErrNotFound)
	wantErr(t, e.p.ReleaseNetworkInterface(ctx, "a", "eth0"), apierr.ErrNotFound)
	_, err = e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "missing", NetworkInterfaceName: "eth0"})
	wantErr(t, err, apierr.ErrNotFound)
	e.assertUnchanged(t, before)
}

func TestDeleteNetwork(t *testing.T) {
	lock := map[string]string{AnnotationNetworkDisableDeletionLock: "true"}
	tests := map[string]struct {
		nics    map[string]map[string]string
		wantErr error
		wantMsg []string
	}{
		"empty":                {},
		"held":                 {nics: map[string]map[string]string{"vm1": nil, "gw": lock}, wantErr: apierr.ErrPrecondition, wantMsg: []string{"1 interface", "vm1"}},
		"only unlocked":        {nics: map[string]map[string]string{"gw": lock, "gw6": {AnnotationNetworkDisableDeletionLock: ""}}},
		"node key does not do": {nics: map[string]map[string]string{"vm1": {AnnotationNodeDisableDeletionLock: "true"}}, wantErr: apierr.ErrPrecondition},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/24"})
			for nic, ann := range tc.nics {
				e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: nic, Annotations: ann})
			}
			before := e.snapshot(t)
			err := e.p.DeleteNetwork(ctx, "lan")
			wantErr(t, err, tc.wantErr)
			if err != nil {
				wantContains(t, err, tc.wantMsg...)
				e.assertUnchanged(t, before)
				return
			}
			_, err = e.p.GetNetwork(ctx, "lan")
			wantErr(t, err, apierr.ErrNotFound)
			// The range is free for another network.
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan2", Ipv4Cidr: "10.0.0.0/16"})
		})
	}
}

func TestReserveNetworkInterfaceBadInput(t *testing.T) {
	type req = poolv1.ReserveNetworkInterfaceRequest
	tests := map[string]struct {
		req     *req
		wantErr error
		wantMsg []string
	}{
		"malformed MAC":       {req: &req{HardwareAddress: "zz:zz:zz:zz:zz:zz"}, wantErr: apierr.ErrInvalid},
		"short MAC":           {req: &req{HardwareAddress: "52:54:00:00:00"}, wantErr: apierr.ErrInvalid},
		"8-byte MAC":          {req: &req{HardwareAddress: "52:54:00:ff:fe:00:00:01"}, wantErr: apierr.ErrInvalid},
		"20-byte MAC":         {req: &req{HardwareAddress: strings.Repeat("02:", 19) + "02"}, wantErr: apierr.ErrInvalid},
		"multicast MAC":       {req: &req{HardwareAddress: "01:00:5e:00:00:01"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"multicast"}},
		"broadcast MAC":       {req: &req{HardwareAddress: "ff:ff:ff:ff:ff:ff"}, wantErr: apierr.ErrInvalid},
		"all-zero MAC":        {req: &req{HardwareAddress: "00:00:00:00:00:00"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"zero"}},
		"MAC taken":           {req: &req{HardwareAddress: "52:54:00:ab:cd:ef"}, wantErr: apierr.ErrAlreadyExists, wantMsg: []string{`"taken"`}},
		"MAC taken uppercase": {req: &req{HardwareAddress: "52:54:00:AB:CD:EF"}, wantErr: apierr.ErrAlreadyExists},
		"MAC taken dotted":    {req: &req{HardwareAddress: "5254.00ab.cdef"}, wantErr: apierr.ErrAlreadyExists},
		"v4 garbage":          {req: &req{Ipv4Address: "garbage"}, wantErr: apierr.ErrInvalid},
		"v4 with prefix":      {req: &req{Ipv4Address: "10.0.0.5/24"}, wantErr: apierr.ErrInvalid},
		"v4 outside":          {req: &req{Ipv4Address: "10.0.1.5"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"outside"}},
		"v4 network address":  {req: &req{Ipv4Address: "10.0.0.0"}, wantErr: apierr.ErrInvalid},
		"v4 broadcast":        {req: &req{Ipv4Address: "10.0.0.255"}, wantErr: apierr.ErrInvalid},
		"v4 gateway":          {req: &req{Ipv4Address: "10.0.0.1"}, wantErr: apierr.ErrAlreadyExists, wantMsg: []string{"gateway"}},
		"v4 taken":            {req: &req{Ipv4Address: "10.0.0.10"}, wantErr: apierr.ErrAlreadyExists, wantMsg: []string{`"taken"`}},
		"v4 mapped in v6":     {req: &req{Ipv4Address: "::ffff:10.0.0.5"}, wantErr: apierr.ErrInvalid},
		"v4 is ipv6":          {req: &req{Ipv4Address: "fd00::5"}, wantErr: apierr.ErrInvalid},
		"v4 on v6-only":       {req: &req{NetworkName: "v6only", Ipv4Address: "10.0.0.5"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"no ipv4_cidr"}},
		"v6 on v4-only":       {req: &req{NetworkName: "v4only", Ipv6Address: "fd00::5"}, wantErr: apierr.ErrInvalid, wantMsg: []string{"no ipv6_cidr"}},
		"v6 outside":          {req: &req{Ipv6Address: "fd01::5"}, wantErr: apierr.ErrInvalid},
		"v6 anycast":          {req: &req{Ipv6Address: "fd00::"}, wantErr: apierr.ErrInvalid},
		"v6 gateway":          {req: &req{Ipv6Address: "fd00::1"}, wantErr: apierr.ErrAlreadyExists},
		"v6 taken":            {req: &req{Ipv6Address: "fd00::10"}, wantErr: apierr.ErrAlreadyExists},
		"v6 taken other form": {req: &req{Ipv6Address: "FD00:0::10"}, wantErr: apierr.ErrAlreadyExists},
		"v6 is ipv4":          {req: &req{Ipv6Address: "10.0.0.5"}, wantErr: apierr.ErrInvalid},
		"v6 garbage":          {req: &req{Ipv6Address: "fd00::g"}, wantErr: apierr.ErrInvalid},
		"interface taken":     {req: &req{NetworkInterfaceName: "taken"}, wantErr: apierr.ErrAlreadyExists},
		"network missing":     {req: &req{NetworkName: "nope"}, wantErr: apierr.ErrNotFound},
		"annotation empty":    {req: &req{Annotations: map[string]string{"": "x"}}, wantErr: apierr.ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "net", Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.1", Ipv6Cidr: "fd00::/64", Ipv6Gateway: "fd00::1"})
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "v6only", Ipv6Cidr: "fd01::/64"})
			e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "v4only", Ipv4Cidr: "10.1.0.0/24"})
			e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "net", NetworkInterfaceName: "taken", HardwareAddress: "52:54:00:ab:cd:ef", Ipv4Address: "10.0.0.10", Ipv6Address: "fd00::10"})
			before := e.snapshot(t)
			if tc.req.NetworkName == "" {
				tc.req.NetworkName = "net"
			}
			if tc.req.NetworkInterfaceName == "" {
				tc.req.NetworkInterfaceName = "new"
			}
			_, err := e.p.ReserveNetworkInterface(context.Background(), tc.req)
			wantErr(t, err, tc.wantErr)
			wantContains(t, err, tc.wantMsg...)
			e.assertUnchanged(t, before)
		})
	}
}

func TestReserveNetworkInterfaceExplicit(t *testing.T) {
	tests := map[string]struct {
		net  *poolv1.ApplyNetworkRequest
		req  *poolv1.ReserveNetworkInterfaceRequest
		want *poolv1.NetworkInterface
	}{
		"everything given": {
			net:  &poolv1.ApplyNetworkRequest{Ipv4Cidr: "10.0.0.0/24", Ipv6Cidr: "fd00::/64"},
			req:  &poolv1.ReserveNetworkInterfaceRequest{Annotations: map[string]string{"k": "v"}, HardwareAddress: "02:AA:BB:CC:DD:EE", Ipv4Address: "10.0.0.77", Ipv6Address: "FD00::77"},
			want: &poolv1.NetworkInterface{Annotations: map[string]string{"k": "v"}, HardwareAddress: "02:aa:bb:cc:dd:ee", Ipv4Address: "10.0.0.77", Ipv6Address: "fd00::77"},
		},
		"gateway address as an interface when the network has none": {
			net:  &poolv1.ApplyNetworkRequest{Ipv4Cidr: "10.0.0.0/24"},
			req:  &poolv1.ReserveNetworkInterfaceRequest{HardwareAddress: "02:00:00:00:00:01", Ipv4Address: "10.0.0.254"},
			want: &poolv1.NetworkInterface{HardwareAddress: "02:00:00:00:00:01", Ipv4Address: "10.0.0.254"},
		},
		"v6-only network gets no v4": {
			net:  &poolv1.ApplyNetworkRequest{Ipv6Cidr: "fd00::/64"},
			req:  &poolv1.ReserveNetworkInterfaceRequest{HardwareAddress: "52:54:00:12:34:56"},
			want: &poolv1.NetworkInterface{HardwareAddress: "52:54:00:12:34:56", Ipv6Address: "fd00::5054:ff:fe12:3456"},
		},
		"v4-only network gets no v6": {
			net:  &poolv1.ApplyNetworkRequest{Ipv4Cidr: "10.0.0.0/30"},
			req:  &poolv1.ReserveNetworkInterfaceRequest{HardwareAddress: "52:54:00:12:34:56"},
			want: &poolv1.NetworkInterface{HardwareAddress: "52:54:00:12:34:56", Ipv4Address: "10.0.0.1"},
		},
		"last v6 address is usable": {
			net:  &poolv1.ApplyNetworkRequest{Ipv6Cidr: "fd00::/120"},
			req:  &poolv1.ReserveNetworkInterfaceRequest{HardwareAddress: "52:54:00:12:34:56", Ipv6Address: "fd00::ff"},
			want: &poolv1.NetworkInterface{HardwareAddress: "52:54:00:12:34:56", Ipv6Address: "fd00::ff"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			tc.net.Name = "net"
			e.applyNetwork(t, tc.net)
			tc.req.NetworkName, tc.req.NetworkInterfaceName = "net", "eth0"
			got := e.reserveNIC(t, tc.req)
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("interface (-want +got):\n%s", diff)
			}
			n, _ := e.p.GetNetwork(context.Background(), "net")
			if diff := cmp.Diff(tc.want, n.GetReservedNetworkInterfaces()["eth0"], protocmp.Transform()); diff != "" {
				t.Errorf("stored interface (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIPAMv4Slash24 fills a /24 with gateway .1: 253 distinct addresses,
// never .0, .1 or .255, then apierr.ErrExhausted.
func TestIPAMv4Slash24(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "192.168.10.0/24", Ipv4Gateway: "192.168.10.1"})
	seen4 := map[string]string{}
	seenMAC := map[string]string{}
	for i := range 253 {
		iface := fmt.Sprintf("vm%d", i)
		ni := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: iface})
		a := netip.MustParseAddr(ni.GetIpv4Address())
		if b := a.As4(); b[3] == 0 || b[3] == 1 || b[3] == 255 || b[2] != 10 {
			t.Fatalf("%s got %s", iface, a)
		}
		// Lowest free first: the i-th interface gets .(i+2).
		if want := netip.AddrFrom4([4]byte{192, 168, 10, byte(i + 2)}); a != want {
			t.Errorf("%s got %s, want %s", iface, a, want)
		}
		if other, dup := seen4[a.String()]; dup {
			t.Fatalf("%s and %s share %s", iface, other, a)
		}
		seen4[a.String()] = iface
		mac := ni.GetHardwareAddress()
		if !strings.HasPrefix(mac, "52:54:") {
			t.Errorf("%s MAC %s is not 52:54:xx", iface, mac)
		}
		if other, dup := seenMAC[mac]; dup {
			t.Fatalf("%s and %s share MAC %s", iface, other, mac)
		}
		seenMAC[mac] = iface
		if ni.GetIpv6Address() != "" {
			t.Errorf("v4-only network gave an IPv6 address %s", ni.GetIpv6Address())
		}
	}
	before := e.snapshot(t)
	_, err := e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "one-too-many"})
	wantErr(t, err, apierr.ErrExhausted)
	wantContains(t, err, "192.168.10.0/24", "253 reserved")
	e.assertUnchanged(t, before)
}

func TestIPAMv4Slash30(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "p2p", Ipv4Cidr: "10.0.0.4/30"})
	var got []string
	for _, n := range []string{"a", "b"} {
		got = append(got, e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "p2p", NetworkInterfaceName: n}).GetIpv4Address())
	}
	if diff := cmp.Diff([]string{"10.0.0.5", "10.0.0.6"}, got); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	_, err := e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "p2p", NetworkInterfaceName: "c"})
	wantErr(t, err, apierr.ErrExhausted)
}

func TestIPAMReuse(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/29", Ipv4Gateway: "10.0.0.1"})
	addr := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d", "e"} { // .2 - .6: full
		addr[n] = e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: n}).GetIpv4Address()
	}
	_, err := e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "f"})
	wantErr(t, err, apierr.ErrExhausted)
	for _, n := range []string{"d", "b"} {
		if err := e.p.ReleaseNetworkInterface(ctx, "lan", n); err != nil {
			t.Fatal(err)
		}
	}
	// The lowest released address comes back first.
	if got := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "f"}).GetIpv4Address(); got != addr["b"] {
		t.Errorf("f got %s, want b's old %s", got, addr["b"])
	}
	if got := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "g"}).GetIpv4Address(); got != addr["d"] {
		t.Errorf("g got %s, want d's old %s", got, addr["d"])
	}
	// The same interface name can be reserved again after release.
	if err := e.p.ReleaseNetworkInterface(ctx, "lan", "a"); err != nil {
		t.Fatal(err)
	}
	if got := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "a"}).GetIpv4Address(); got != addr["a"] {
		t.Errorf("a got %s, want %s", got, addr["a"])
	}
}

// eui64Of computes the modified EUI-64 address independently of the code
// under test: flip the U/L bit of the first octet and insert ff:fe.
func eui64Of(t *testing.T, prefix string, mac string) netip.Addr {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	s := fmt.Sprintf("%s%02x%02x:%02xff:fe%02x:%02x%02x", prefix, hw[0]^2, hw[1], hw[2], hw[3], hw[4], hw[5])
	return netip.MustParseAddr(s)
}

func TestIPAMv6EUI64(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "v6", Ipv6Cidr: "2001:db8:1:2::/64", Ipv6Gateway: "2001:db8:1:2::1"})
	seen := map[netip.Addr]string{}
	for i := range 50 {
		iface := fmt.Sprintf("vm%d", i)
		ni := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "v6", NetworkInterfaceName: iface})
		a := netip.MustParseAddr(ni.GetIpv6Address())
		if want := eui64Of(t, "2001:db8:1:2:", ni.GetHardwareAddress()); a != want {
			t.Errorf("%s with MAC %s got %s, want EUI-64 %s", iface, ni.GetHardwareAddress(), a, want)
		}
		if other, dup := seen[a]; dup {
			t.Fatalf("%s and %s share %s", iface, other, a)
		}
		seen[a] = iface
	}
	// A given MAC gets its EUI-64 address.
	ni := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "v6", NetworkInterfaceName: "given", HardwareAddress: "00:16:3e:aa:bb:cc"})
	if got, want := ni.GetIpv6Address(), "2001:db8:1:2:216:3eff:feaa:bbcc"; got != want {
		t.Errorf("given MAC got %s, want %s", got, want)
	}
	// When the EUI-64 address is taken by an explicit reservation, the
	// lowest free address is used instead.
	mac := "02:00:00:00:00:99"
	eui := eui64Of(t, "2001:db8:1:2:", mac)
	e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "v6", NetworkInterfaceName: "squatter", Ipv6Address: eui.String()})
	ni = e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "v6", NetworkInterfaceName: "late", HardwareAddress: mac})
	if got := ni.GetIpv6Address(); got != "2001:db8:1:2::2" {
		t.Errorf("EUI-64 taken: got %s, want the lowest free 2001:db8:1:2::2", got)
	}
	_ = ctx
}

func TestIPAMv6Sequential(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "v6", Ipv6Cidr: "fd00:9::/120", Ipv6Gateway: "fd00:9::1"})
	var got []string
	for i := range 4 {
		got = append(got, e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "v6", NetworkInterfaceName: fmt.Sprintf("vm%d", i)}).GetIpv6Address())
	}
	if diff := cmp.Diff([]string{"fd00:9::2", "fd00:9::3", "fd00:9::4", "fd00:9::5"}, got); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}

	// A /124 holds 15 addresses after the subnet-router anycast; one is
	// the gateway, so 14 interfaces fit.
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "small", Ipv6Cidr: "fd00:8::/124", Ipv6Gateway: "fd00:8::1"})
	seen := map[string]bool{}
	for i := range 14 {
		a := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "small", NetworkInterfaceName: fmt.Sprintf("vm%d", i)}).GetIpv6Address()
		if a == "fd00:8::" || a == "fd00:8::1" || seen[a] {
			t.Fatalf("vm%d got %s", i, a)
		}
		seen[a] = true
	}
	_, err := e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "small", NetworkInterfaceName: "extra"})
	wantErr(t, err, apierr.ErrExhausted)
}

func TestIPAMDualStack(t *testing.T) {
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "ds", Ipv4Cidr: "10.0.0.0/24", Ipv4Gateway: "10.0.0.1", Ipv6Cidr: "fd00::/64"})
	ni := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "ds", NetworkInterfaceName: "vm0"})
	if ni.GetIpv4Address() != "10.0.0.2" {
		t.Errorf("ipv4 = %s, want 10.0.0.2", ni.GetIpv4Address())
	}
	if want := eui64Of(t, "fd00::", ni.GetHardwareAddress()); ni.GetIpv6Address() != want.String() {
		t.Errorf("ipv6 = %s, want %s", ni.GetIpv6Address(), want)
	}
	// Giving one family still allocates the other.
	ni = e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "ds", NetworkInterfaceName: "vm1", Ipv6Address: "fd00::abc"})
	if ni.GetIpv4Address() != "10.0.0.3" || ni.GetIpv6Address() != "fd00::abc" {
		t.Errorf("got %v", ni)
	}
}

func TestGeneratedMAC(t *testing.T) {
	ctx := context.Background()
	// Independent of generateMAC: 52:54 then CRC32-IEEE of "network/iface".
	expect := func(network, iface string) string {
		b := make([]byte, 6)
		b[0], b[1] = 0x52, 0x54
		binary.BigEndian.PutUint32(b[2:], crc32.ChecksumIEEE([]byte(network+"/"+iface)))
		return net.HardwareAddr(b).String()
	}
	e := newEnv(t)
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/24"})
	first := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm1-0"}).GetHardwareAddress()
	if want := expect("lan", "vm1-0"); first != want {
		t.Errorf("MAC = %s, want %s", first, want)
	}
	hw, _ := net.ParseMAC(first)
	if hw[0]&1 != 0 || hw[0]&2 == 0 {
		t.Errorf("MAC %s is not a locally administered unicast address", first)
	}
	// Stable across release and re-reserve, and across pools.
	if err := e.p.ReleaseNetworkInterface(ctx, "lan", "vm1-0"); err != nil {
		t.Fatal(err)
	}
	if again := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm1-0"}).GetHardwareAddress(); again != first {
		t.Errorf("MAC after re-reserve = %s, want %s", again, first)
	}
	e2 := newEnv(t)
	e2.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.0.0.0/24"})
	if other := e2.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm1-0"}).GetHardwareAddress(); other != first {
		t.Errorf("MAC in another pool = %s, want %s", other, first)
	}
	// Different networks give the same interface name different MACs.
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "wan", Ipv4Cidr: "10.1.0.0/24"})
	if w := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "wan", NetworkInterfaceName: "vm1-0"}).GetHardwareAddress(); w == first {
		t.Errorf("same MAC %s on two networks", w)
	}

	// Force a collision: pre-reserve the MAC the next interface would get.
	next := expect("lan", "vm2-0")
	e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "squatter", HardwareAddress: next})
	got := e.reserveNIC(t, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: "vm2-0"}).GetHardwareAddress()
	if got == next {
		t.Fatalf("generated MAC %s collides with squatter", got)
	}
	if !strings.HasPrefix(got, "52:54:") {
		t.Errorf("re-derived MAC %s is not 52:54:xx", got)
	}
	if want := generateMAC("lan", "vm2-0", 1).String(); got != want {
		t.Errorf("re-derived MAC = %s, want %s", got, want)
	}
	n, _ := e.p.GetNetwork(ctx, "lan")
	macs := map[string]string{}
	for name, ni := range n.GetReservedNetworkInterfaces() {
		if other, dup := macs[ni.GetHardwareAddress()]; dup {
			t.Errorf("%s and %s share %s", name, other, ni.GetHardwareAddress())
		}
		macs[ni.GetHardwareAddress()] = name
	}
}
