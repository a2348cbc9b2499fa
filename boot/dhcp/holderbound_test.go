package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// TestHolderRecordsBoundedByPool: MACs that come and go through a small
// range (each binds, then releases, declines or just lets its lease run
// out, and a new MAC comes) never leave more holder records in the store
// than the range has addresses, and every holder names an address whose
// lease names its MAC. Three times the pool's size in MACs pass through a
// bolt store; before holders were deleted with the binding they belong to
// (2026-11-29) the store kept one per MAC that ever bound: 12 here.
func TestHolderRecordsBoundedByPool(t *testing.T) {
	const pool = 4
	ctx := context.Background()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := time.Unix(1_800_000_000, 0)
	p := newLeases(st, func() time.Time { return clock }, time.Minute, slog.New(slog.DiscardHandler))
	r := Range{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Start: netip.MustParseAddr("10.9.0.10"), End: netip.MustParseAddr("10.9.0.13")}
	most := 0
	for i := range 3 * pool {
		mac := fmt.Sprintf("52:54:00:00:02:%02x", i)
		ip, err := p.Offer(mac, "", r, netip.Addr{})
		if err != nil {
			t.Fatalf("MAC %d: offer: %v", i, err)
		}
		if _, err := p.Bind(ctx, mac, "", NeedOffer, ip, r, time.Minute, "", ""); err != nil {
			t.Fatalf("MAC %d: bind %s: %v", i, ip, err)
		}
		switch i % 3 {
		case 0:
			if _, err := p.Release(ctx, mac, ip); err != nil {
				t.Fatalf("MAC %d: release %s: %v", i, ip, err)
			}
		case 1:
			if _, err := p.Decline(ctx, mac, "", ip, r); err != nil {
				t.Fatalf("MAC %d: decline %s: %v", i, ip, err)
			}
		}
		n := checkHolders(t, st)
		most = max(most, n)
		clock = clock.Add(2 * time.Minute) // every lease and quarantine ran out
	}
	t.Logf("%d MACs through a pool of %d: at most %d holder records stored (before: one per MAC, %d)", 3*pool, pool, most, 3*pool)
	if most > pool {
		t.Errorf("%d holder records stored, more than the pool's %d addresses", most, pool)
	}
}

// checkHolders returns the holder records stored, and fails t for one
// that names an address whose lease does not name its MAC.
func checkHolders(t *testing.T, st store.Store) int {
	t.Helper()
	ctx := context.Background()
	hs, err := st.List(ctx, LeaseHoldersPrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		var l bootv1.Lease
		if _, err := record.Get(ctx, st, LeasePrefix+string(h.Value), &l); err != nil {
			t.Errorf("holder %s names %s: %v", h.Key, h.Value, err)
			continue
		}
		if mac := h.Key[len(h.Key)-17:]; l.GetMac() != mac {
			t.Errorf("holder %s names %s, whose lease is %s's (%s)", h.Key, h.Value, l.GetMac(), l.GetState())
		}
	}
	return len(hs)
}

// TestPinAfterReleaseHoldsTheMAC: a RELEASE deletes the MAC's holder, and
// pinning the released lease (active again) writes it back, so another
// appliance cannot bind the MAC to a second address while it is pinned.
func TestPinAfterReleaseHoldsTheMAC(t *testing.T) {
	ctx := context.Background()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := Range{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Start: netip.MustParseAddr("10.9.0.10"), End: netip.MustParseAddr("10.9.0.20")}
	p := newLeases(st, time.Now, time.Minute, slog.New(slog.DiscardHandler))
	const mac = "52:54:00:00:03:01"
	ip, _ := p.Offer(mac, "", r, netip.Addr{})
	if _, err := p.Bind(ctx, mac, "", NeedOffer, ip, r, time.Hour, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(ctx, mac, ip); err != nil {
		t.Fatal(err)
	}
	if n := checkHolders(t, st); n != 0 {
		t.Fatalf("%d holder records after the RELEASE, want 0", n)
	}
	if _, err := p.pin(ctx, mac, "deployment:d1"); err != nil {
		t.Fatal(err)
	}
	if n := checkHolders(t, st); n != 1 {
		t.Fatalf("%d holder records after the pin, want 1", n)
	}
	// Another appliance, which never saw the lease, binds the MAC elsewhere.
	other := newLeases(st, time.Now, time.Minute, slog.New(slog.DiscardHandler))
	next := ip.Next()
	other.Offer(mac, "", r, next)
	if _, err := other.Bind(ctx, mac, "", NeedOffer, next, r, time.Hour, "", ""); !errors.Is(err, ErrOtherAddress) {
		t.Fatalf("binding the pinned MAC to %s elsewhere: %v, want ErrOtherAddress", next, err)
	}
}
