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
