package pool

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/fakeclock"
)

var etcdPrefixSeq atomic.Int64

// appliances returns n Pools on one empty prefix of c, each on an etcd
// client of its own: n appliances of one fleet.
func appliances(t *testing.T, c *etcdtest.Cluster, n int) []*Pool {
	t.Helper()
	prefix := fmt.Sprintf("/pool%d", etcdPrefixSeq.Add(1))
	clock := fakeclock.New(t0)
	var pools []*Pool
	for range n {
		s, err := etcd.Open(context.Background(), etcd.Options{Endpoints: c.Endpoints(), Prefix: prefix, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("etcd.Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		p, err := New(Config{Store: s, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
	}
	return pools
}

// TestEtcdContentionTwoAppliances: the contention tests on a real 3-member
// etcd cluster through two appliances at once, each on its own client,
// the racing goroutines alternating between them. Writers of one hot
// record conflict in etcd (there is no single writer transaction as in
// bbolt): the bounded compare-and-swap loop must still give exactly 10
// computes and 253 distinct addresses.
func TestEtcdContentionTwoAppliances(t *testing.T) {
	c := etcdtest.New(t, 3)
	t.Run("ReserveCompute", func(t *testing.T) { raceReserveCompute(t, appliances(t, c, 2)...) })
	t.Run("ReserveNetworkInterface", func(t *testing.T) { raceReserveNetworkInterface(t, appliances(t, c, 2)...) })
}
