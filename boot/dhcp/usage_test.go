package dhcp

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/store/mem"
	"github.com/google/go-cmp/cmp"
)

// TestRangeUsage: a range's free addresses drop with each pending offer,
// live binding and quarantined DECLINE, and come back when a lease
// expires; an address of another range is not counted.
func TestRangeUsage(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	p := newLeases(mem.New(), now, time.Minute, slog.New(slog.DiscardHandler))
	sub := netip.MustParsePrefix("10.0.0.0/24")
	r := Range{Subnet: sub, Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.109")}
	other := Range{Subnet: netip.MustParsePrefix("10.1.0.0/24"), Start: netip.MustParseAddr("10.1.0.10"), End: netip.MustParseAddr("10.1.0.10"), Relayed: true}
	ranges := []Range{r, other}
	check := func(what string, free uint64) {
		t.Helper()
		want := []RangeUsage{{Range: "10.0.0.100-10.0.0.109", Size: 10, Free: free}, {Range: "10.1.0.10-10.1.0.10", Size: 1, Free: 1}}
		if d := cmp.Diff(want, p.usage(ranges)); d != "" {
			t.Errorf("%s (-want +got):\n%s", what, d)
		}
	}
	check("empty", 10)
	ctx := context.Background()
	ip1, err := p.Offer("52:54:00:00:00:01", "", r, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	check("one offer pending", 9)
	if _, err := p.Bind(ctx, "52:54:00:00:00:01", "", NeedOffer, ip1, r, time.Hour, "", ""); err != nil {
		t.Fatal(err)
	}
	check("one bound", 9)
	ip2, err := p.Offer("52:54:00:00:00:02", "", r, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Bind(ctx, "52:54:00:00:00:02", "", NeedOffer, ip2, r, time.Minute, "", ""); err != nil {
		t.Fatal(err)
	}
	ip3, err := p.Offer("52:54:00:00:00:03", "", r, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Bind(ctx, "52:54:00:00:00:03", "", NeedOffer, ip3, r, time.Hour, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Decline(ctx, "52:54:00:00:00:03", "", ip3, r); err != nil {
		t.Fatal(err)
	}
	check("two bound, one quarantined", 7)
	mu.Lock()
	clock = clock.Add(2 * time.Minute) // ip2's lease and ip3's quarantine end
	mu.Unlock()
	check("one lease and the quarantine ended", 9)
	if got := (Range{Start: netip.MustParseAddr("10.0.0.0"), End: netip.MustParseAddr("10.255.255.255")}).size(); got != 1<<24 {
		t.Errorf("size of a /8 range: %d", got)
	}
	var s *Server
	if s.RangeUsage() != nil || (&Server{}).RangeUsage() != nil {
		t.Error("a server without leases (proxy mode) reports ranges")
	}
}
