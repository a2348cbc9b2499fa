package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// TestHolderCacheBounded: MACs that come and go never grow the holder
// cache past holderCacheMax, and a MAC the cache forgot still renews its
// binding (after one conflict, the holder is read again).
func TestHolderCacheBounded(t *testing.T) {
	old := holderCacheMax
	holderCacheMax = 4
	t.Cleanup(func() { holderCacheMax = old })
	ctx := context.Background()
	p := newLeases(mem.New(), time.Now, 0, slog.New(slog.DiscardHandler))
	r := Range{Subnet: netip.MustParsePrefix("10.9.0.0/24")}
	revs := map[int]int64{}
	for i := range 10 {
		ip := netip.AddrFrom4([4]byte{10, 9, 0, byte(10 + i)})
		rev, err := p.commitBind(ctx, ip, &bootv1.Lease{Mac: fmt.Sprintf("52:54:00:00:00:%02x", i), Ip: ip.String()}, 0, "", false, r, time.Now())
		if err != nil {
			t.Fatalf("bind %d: %v", i, err)
		}
		revs[i] = rev
		if n := len(p.holders); n > holderCacheMax {
			t.Fatalf("%d holders cached, more than %d", n, holderCacheMax)
		}
	}
	// MAC 0 was forgotten: its renewal conflicts once, then commits.
	ip := netip.AddrFrom4([4]byte{10, 9, 0, 10})
	l := &bootv1.Lease{Mac: "52:54:00:00:00:00", Ip: ip.String()}
	_, err := p.commitBind(ctx, ip, l, revs[0], "", false, r, time.Now())
	if err != nil && !errors.Is(err, store.ErrConflict) {
		t.Fatalf("renewal of a forgotten holder: %v", err)
	}
	if err != nil {
		if _, err := p.commitBind(ctx, ip, l, revs[0], "", false, r, time.Now()); err != nil {
			t.Fatalf("renewal after reading the holder again: %v", err)
		}
	}
}
