package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/require"
)

// TestFleetBindsAMACOnce: three appliances, each on its own client of a
// real three-member etcd cluster and with no view of the others' leases
// but what their own conflicts re-read (the lag of a storm, when the
// lease watch falls behind), each offer every one of 60 MACs an address
// and bind it, all at once. Each MAC ends with exactly one live lease in
// the store, no address is leased to two MACs, and every MAC got an ACK
// (a refused binding retried as its client would: DISCOVER again, then
// REQUEST what is offered).
func TestFleetBindsAMACOnce(t *testing.T) {
	require.Tool(t, "etcd")
	const (
		appliances = 3
		macs       = 60
	)
	c := etcdtest.New(t, 3)
	ctx := context.Background()
	r := Range{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Start: netip.MustParseAddr("10.9.0.10"), End: netip.MustParseAddr("10.9.0.250")}
	var (
		pools []*leases
		sts   []store.Store
	)
	for range appliances {
		st, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: "/holders"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		sts = append(sts, st)
		pools = append(pools, newLeases(st, time.Now, time.Minute, slog.New(slog.DiscardHandler)))
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked = map[string]bool{}
		fails []error
	)
	for m := range macs {
		mac := fmt.Sprintf("52:54:00:00:01:%02x", m)
		for a := range appliances {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Like a client: DISCOVER, REQUEST what was offered, and
				// again after a NAK, a few times.
				for range 5 {
					ip, err := pools[a].Offer(mac, "", r, netip.Addr{})
					if err != nil {
						mu.Lock()
						fails = append(fails, err)
						mu.Unlock()
						return
					}
					_, err = pools[a].Bind(ctx, mac, "", NeedOffer, ip, r, time.Hour, "", "")
					if err == nil {
						mu.Lock()
						acked[mac] = true
						mu.Unlock()
						return
					}
					if !errors.Is(err, ErrOtherAddress) && !errors.Is(err, ErrTaken) && !errors.Is(err, ErrNotOffered) {
						mu.Lock()
						fails = append(fails, fmt.Errorf("%s via appliance %d: %w", mac, a, err))
						mu.Unlock()
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, err := range fails {
		t.Error(err)
	}
	if len(acked) != macs {
		t.Errorf("%d of %d MACs got an ACK", len(acked), macs)
	}
	ls, err := record.List(ctx, sts[0], LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	liveOf := map[string][]string{}
	now := time.Now()
	for _, l := range ls {
		if live(l, now) {
			liveOf[l.GetMac()] = append(liveOf[l.GetMac()], l.GetIp())
		}
	}
	for mac, ips := range liveOf {
		if len(ips) != 1 {
			t.Errorf("%s holds %d live leases: %v", mac, len(ips), ips)
		}
	}
	if len(liveOf) != macs {
		t.Errorf("%d MACs hold a live lease, want %d", len(liveOf), macs)
	}
	var contended uint64
	for _, p := range pools {
		contended += p.contended.Load()
	}
	t.Logf("%d leases stored, %d bindings refused for the MAC's other live address", len(ls), contended)
}

// TestFleetHoldersBoundedWhileMACsCycle: three appliances on a real
// three-member etcd cluster, each seeing the others' leases only through
// its own conflicts, take MACs that come and go through a range of 12
// addresses: in each of three rounds 8 new MACs each try every appliance
// at once, every other MAC RELEASEs its lease, and then every lease runs
// out. Afterwards the store holds no more holder records than the range
// has addresses (24 MACs bound), each naming an address whose lease names
// its MAC, and no MAC ever held two live leases. Before holders were
// deleted with the binding they belong to (2026-11-29): 24 records.
func TestFleetHoldersBoundedWhileMACsCycle(t *testing.T) {
	require.Tool(t, "etcd")
	const (
		appliances = 3
		rounds     = 3
		perRound   = 8
	)
	c := etcdtest.New(t, 3)
	ctx := context.Background()
	r := Range{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Start: netip.MustParseAddr("10.9.0.10"), End: netip.MustParseAddr("10.9.0.21")}
	var (
		clockMu sync.Mutex
		clock   = time.Now()
	)
	now := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	var (
		pools []*leases
		sts   []store.Store
	)
	for range appliances {
		st, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: "/cycle"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		sts = append(sts, st)
		pools = append(pools, newLeases(st, now, time.Minute, slog.New(slog.DiscardHandler)))
	}
	bound := 0
	for round := range rounds {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			acked = map[string]netip.Addr{}
		)
		for m := range perRound {
			mac := fmt.Sprintf("52:54:00:00:%02x:%02x", round, m)
			for a := range appliances {
				wg.Go(func() {
					for range 8 {
						ip, err := pools[a].Offer(mac, "", r, netip.Addr{})
						if err != nil {
							t.Errorf("%s via appliance %d: %v", mac, a, err)
							return
						}
						if _, err := pools[a].Bind(ctx, mac, "", NeedOffer, ip, r, time.Minute, "", ""); err == nil {
							mu.Lock()
							acked[mac] = ip
							mu.Unlock()
							return
						} else if !errors.Is(err, ErrOtherAddress) && !errors.Is(err, ErrTaken) && !errors.Is(err, ErrNotOffered) {
							t.Errorf("%s via appliance %d: %v", mac, a, err)
							return
						}
					}
				})
			}
		}
		wg.Wait()
		if len(acked) != perRound {
			t.Fatalf("round %d: %d of %d MACs got an ACK", round, len(acked), perRound)
		}
		bound += len(acked)
		checkFleetLeases(t, sts[0], now())
		i := 0
		for mac, ip := range acked {
			if i++; i%2 == 0 {
				if _, err := pools[i%appliances].Release(ctx, mac, ip); err != nil {
					t.Fatalf("release %s of %s: %v", ip, mac, err)
				}
			}
		}
		clockMu.Lock()
		clock = clock.Add(2 * time.Minute) // every lease ran out
		clockMu.Unlock()
	}
	n := checkHolders(t, sts[0])
	t.Logf("%d MACs bound through a range of 12 by %d appliances: %d holder records stored", bound, appliances, n)
	if n > 12 {
		t.Errorf("%d holder records stored, more than the range's 12 addresses", n)
	}
}

// checkFleetLeases fails t for a MAC holding two live leases at now.
func checkFleetLeases(t *testing.T, st store.Store, now time.Time) {
	t.Helper()
	ls, err := record.List(context.Background(), st, LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		t.Fatal(err)
	}
	liveOf := map[string][]string{}
	for _, l := range ls {
		if live(l, now) {
			liveOf[l.GetMac()] = append(liveOf[l.GetMac()], l.GetIp())
		}
	}
	for mac, ips := range liveOf {
		if len(ips) != 1 {
			t.Errorf("%s holds %d live leases: %v", mac, len(ips), ips)
		}
	}
}
