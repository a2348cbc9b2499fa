package pool

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// FuzzApplyNetwork feeds arbitrary CIDR and gateway strings to ApplyNetwork.
// It must never panic; a refused network must be refused with apierr.ErrInvalid
// (there is nothing for it to overlap or change) and leave nothing stored;
// an accepted one must be stored in canonical form, read back identically,
// be re-appliable from what was returned, and hand out an address inside
// its ranges that is not the gateway.
//
// The committed corpus is under testdata/fuzz/FuzzApplyNetwork.
func FuzzApplyNetwork(f *testing.F) {
	f.Add("10.0.0.0/24", "", "10.0.0.1")
	f.Add("10.0.0.5/24", "", "")
	f.Add("", "fd00::/64", "fd00::1")
	f.Add("192.168.0.0/30", "2001:db8::/126", "192.168.0.2")
	f.Add("0.0.0.0/0", "::/0", "255.255.255.254")
	f.Add("garbage", "fd00::/129", "::1")
	f.Add("10.0.0.0/33", "FD00:0::/64", "10.0.0.255")
	f.Add("::ffff:10.0.0.0/120", "10.0.0.0/24", "")
	f.Fuzz(func(t *testing.T, v4, v6, gw string) {
		ctx := context.Background()
		e := newEnv(t)
		req := &poolv1.ApplyNetworkRequest{Name: "fuzz", Ipv4Cidr: v4, Ipv6Cidr: v6}
		// The gateway goes to the family it parses as, or to IPv4 when it
		// does not parse at all.
		if a, err := netip.ParseAddr(gw); err == nil && a.Is6() {
			req.Ipv6Gateway = gw
		} else {
			req.Ipv4Gateway = gw
		}
		got, err := e.p.ApplyNetwork(ctx, req)
		if err != nil {
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("refused with %v, want apierr.ErrInvalid", err)
			}
			if nets, _ := e.p.ListNetworks(ctx); len(nets) != 0 {
				t.Fatalf("refused network was stored: %v", nets)
			}
			if raw, _ := e.s.List(ctx, ""); len(raw) != 0 {
				t.Fatalf("refused network left %d records", len(raw))
			}
			return
		}
		stored, err := e.p.GetNetwork(ctx, "fuzz")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(got, stored, protocmp.Transform()); diff != "" {
			t.Fatalf("returned and stored differ (-ret +stored):\n%s", diff)
		}
		var v4p, v6p netip.Prefix
		for _, c := range []struct {
			s   string
			pfx *netip.Prefix
			is4 bool
		}{{got.GetIpv4Cidr(), &v4p, true}, {got.GetIpv6Cidr(), &v6p, false}} {
			if c.s == "" {
				continue
			}
			p, err := netip.ParsePrefix(c.s)
			if err != nil || p.String() != c.s || p.Masked() != p || p.Addr().Is4() != c.is4 {
				t.Fatalf("stored CIDR %q is not a canonical masked prefix of its family", c.s)
			}
			*c.pfx = p
		}
		if !v4p.IsValid() && !v6p.IsValid() {
			t.Fatal("accepted a network with no CIDR")
		}
		for _, g := range []struct {
			s   string
			pfx netip.Prefix
		}{{got.GetIpv4Gateway(), v4p}, {got.GetIpv6Gateway(), v6p}} {
			if g.s == "" {
				continue
			}
			a, err := netip.ParseAddr(g.s)
			if err != nil || a.String() != g.s || !g.pfx.Contains(a) || a == g.pfx.Addr() {
				t.Fatalf("stored gateway %q is not a canonical host address of %s", g.s, g.pfx)
			}
		}
		// Re-applying what was returned is a no-op.
		again, err := e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{
			Name: "fuzz", Ipv4Cidr: got.GetIpv4Cidr(), Ipv6Cidr: got.GetIpv6Cidr(),
			Ipv4Gateway: got.GetIpv4Gateway(), Ipv6Gateway: got.GetIpv6Gateway(),
		})
		if err != nil {
			t.Fatalf("re-apply of %v: %v", got, err)
		}
		if diff := cmp.Diff(got, again, protocmp.Transform()); diff != "" {
			t.Fatalf("re-apply changed the network (-first +again):\n%s", diff)
		}
		// And the original spelling is not a change either.
		if _, err := e.p.ApplyNetwork(ctx, req); err != nil {
			t.Fatalf("re-apply of the original request: %v", err)
		}
		// One interface gets addresses inside the ranges.
		nw, err := e.p.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "fuzz", NetworkInterfaceName: "eth0"})
		if err != nil {
			t.Fatalf("reserve on %v: %v", got, err)
		}
		ni := nw.GetReservedNetworkInterfaces()["eth0"]
		for _, c := range []struct {
			s   string
			pfx netip.Prefix
			gw  string
		}{{ni.GetIpv4Address(), v4p, got.GetIpv4Gateway()}, {ni.GetIpv6Address(), v6p, got.GetIpv6Gateway()}} {
			if !c.pfx.IsValid() {
				if c.s != "" {
					t.Fatalf("address %s on a network without that family", c.s)
				}
				continue
			}
			a, err := netip.ParseAddr(c.s)
			if err != nil || !c.pfx.Contains(a) || a == c.pfx.Addr() || c.s == c.gw {
				t.Fatalf("interface got %q in %s (gateway %q)", c.s, c.pfx, c.gw)
			}
		}
	})
}
