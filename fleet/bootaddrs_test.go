package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// countingStore counts List calls of the leases on a real store.
type countingStore struct {
	store.Store
	lists atomic.Int64
}

func (c *countingStore) List(ctx context.Context, prefix string) ([]store.KV, error) {
	if prefix == LeasePrefix {
		c.lists.Add(1)
	}
	return c.Store.List(ctx, prefix)
}

// TestBootAddrsListsOnlyForMachines: with runners that have boot segments
// but no machine with a boot MAC, the leases are never listed; once a
// machine has one they are (at most once per Interval).
func TestBootAddrsListsOnlyForMachines(t *testing.T) {
	r := newRig(t)
	cs := &countingStore{Store: r.st}
	r.d.Store = cs
	r.s = r.d.newDispatch()
	for i := range 50 {
		l := &bootv1.Lease{Ip: "192.168.0." + string(rune('0'+i%10)), Mac: "aa:bb:cc:00:00:99", UpdatedUnix: int64(i)}
		if _, err := record.Put(context.Background(), r.st, LeasePrefix+l.Ip+"-"+string(rune('a'+i)), l, 0); err != nil {
			t.Fatal(err)
		}
	}
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.machine(t, "m0", "", "")
	r.pass(t)
	r.clk.Advance(2 * DefaultDispatchInterval)
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.pass(t)
	if n := cs.lists.Load(); n != 0 {
		t.Errorf("leases listed %d times with no machine wanting one", n)
	}
	r.machine(t, "m1", "", "aa:bb:cc:00:00:99")
	r.clk.Advance(2 * DefaultDispatchInterval)
	r.beat(t, appliance("a", "", nil, []string{"192.168.0.0/24"}), time.Second)
	r.pass(t)
	if n := cs.lists.Load(); n != 1 {
		t.Errorf("leases listed %d times for a machine with a boot MAC, want 1", n)
	}
	if got := r.s.leases["aa:bb:cc:00:00:99"].String(); got != "192.168.0.9" {
		t.Errorf("boot address %s, want the newest lease's 192.168.0.9", got)
	}
}
