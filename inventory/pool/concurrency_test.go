package pool

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"testing"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

// stores are the backends the concurrency tests run on.
var stores = map[string]func(testing.TB, ...func(*Config)) *env{
	"mem":  newEnv,
	"bolt": newBoltEnv,
}

// TestConcurrentReserveCompute: 64 goroutines race for a node with room for
// exactly 10 computes; exactly 10 win, 54 get apierr.ErrExhausted, and the stored
// node holds exactly the winners.
func TestConcurrentReserveCompute(t *testing.T) {
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) { raceReserveCompute(t, mk(t).p) })
	}
}

// raceReserveCompute is TestConcurrentReserveCompute on pools sharing one
// store (several appliances): goroutine i calls through pools[i%len].
func raceReserveCompute(t *testing.T, pools ...*Pool) {
	ctx := context.Background()
	if _, err := pools[0].ApplyNode(ctx, nodeReq("hv1", 10000, 10*gib, 0)); err != nil {
		t.Fatal(err)
	}
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = pools[i%len(pools)].ReserveCompute(ctx, "hv1", fmt.Sprintf("vm%02d", i), compute(1000, gib))
		})
	}
	close(start)
	wg.Wait()
	var won []string
	exhausted := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won = append(won, fmt.Sprintf("vm%02d", i))
		case errors.Is(err, apierr.ErrExhausted):
			exhausted++
		default:
			t.Errorf("vm%02d: unexpected error %v", i, err)
		}
	}
	if len(won) != 10 || exhausted != 54 {
		t.Errorf("%d succeeded and %d exhausted, want 10 and 54", len(won), exhausted)
	}
	for _, p := range pools {
		node, err := p.GetNode(ctx, "hv1")
		if err != nil {
			t.Fatal(err)
		}
		var stored []string
		for k := range node.GetReservedComputes() {
			stored = append(stored, k)
		}
		sort.Strings(stored)
		if diff := cmp.Diff(won, stored); diff != "" {
			t.Errorf("stored reservations differ from the winners (-won +stored):\n%s", diff)
		}
	}
}

// TestConcurrentReserveNetworkInterface: 300 goroutines race for a /24 with
// a gateway; exactly 253 win with distinct addresses and MACs, 47 get
// apierr.ErrExhausted.
func TestConcurrentReserveNetworkInterface(t *testing.T) {
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) { raceReserveNetworkInterface(t, mk(t).p) })
	}
}

// raceReserveNetworkInterface is TestConcurrentReserveNetworkInterface on
// pools sharing one store: goroutine i calls through pools[i%len].
func raceReserveNetworkInterface(t *testing.T, pools ...*Pool) {
	ctx := context.Background()
	if _, err := pools[0].ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "lan", Ipv4Cidr: "10.20.30.0/24", Ipv4Gateway: "10.20.30.1"}); err != nil {
		t.Fatal(err)
	}
	const n = 300
	errs := make([]error, n)
	got := make([]*poolv1.NetworkInterface, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			iface := fmt.Sprintf("vm%03d", i)
			nw, err := pools[i%len(pools)].ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "lan", NetworkInterfaceName: iface})
			errs[i] = err
			if err == nil {
				got[i] = nw.GetReservedNetworkInterfaces()[iface]
			}
		})
	}
	close(start)
	wg.Wait()
	ok, exhausted := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, apierr.ErrExhausted):
			exhausted++
		default:
			t.Errorf("vm%03d: unexpected error %v", i, err)
		}
	}
	if ok != 253 || exhausted != 47 {
		t.Errorf("%d succeeded and %d exhausted, want 253 and 47", ok, exhausted)
	}
	for _, p := range pools {
		nw, err := p.GetNetwork(ctx, "lan")
		if err != nil {
			t.Fatal(err)
		}
		stored := nw.GetReservedNetworkInterfaces()
		if len(stored) != ok {
			t.Errorf("network holds %d interfaces, %d calls succeeded", len(stored), ok)
		}
		addrs, macs := map[string]string{}, map[string]string{}
		pfx := netip.MustParsePrefix("10.20.30.0/24")
		for iface, ni := range stored {
			a := netip.MustParseAddr(ni.GetIpv4Address())
			if !pfx.Contains(a) || a.As4()[3] == 0 || a.As4()[3] == 1 || a.As4()[3] == 255 {
				t.Errorf("%s got %s", iface, a)
			}
			if other, dup := addrs[ni.GetIpv4Address()]; dup {
				t.Errorf("%s and %s share %s", iface, other, a)
			}
			addrs[ni.GetIpv4Address()] = iface
			if other, dup := macs[ni.GetHardwareAddress()]; dup {
				t.Errorf("%s and %s share MAC %s", iface, other, ni.GetHardwareAddress())
			}
			macs[ni.GetHardwareAddress()] = iface
		}
		// What each winner was told is what is stored.
		for i, ni := range got {
			if ni == nil {
				continue
			}
			s := stored[fmt.Sprintf("vm%03d", i)]
			if s.GetIpv4Address() != ni.GetIpv4Address() || s.GetHardwareAddress() != ni.GetHardwareAddress() {
				t.Errorf("vm%03d was told %v but %v is stored", i, ni, s)
			}
		}
	}
}

// TestConcurrentApplyNetworkOverlap: many goroutines apply mutually
// overlapping networks of different names; exactly one wins.
func TestConcurrentApplyNetworkOverlap(t *testing.T) {
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := mk(t)
			const n = 16
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					// 10.0.0.0/16, /17, ..., all containing 10.0.0.0.
					_, errs[i] = e.p.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{
						Name: fmt.Sprintf("net%02d", i), Ipv4Cidr: fmt.Sprintf("10.0.0.0/%d", 14+i),
					})
				})
			}
			wg.Wait()
			won := 0
			for i, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, apierr.ErrPrecondition):
					t.Errorf("net%02d: unexpected error %v", i, err)
				}
			}
			nets, _ := e.p.ListNetworks(ctx)
			if won != 1 || len(nets) != 1 {
				t.Errorf("%d ApplyNetwork calls won and %d networks exist, want 1 and 1", won, len(nets))
			}
		})
	}
}

// TestConcurrentReserveAndApplyNode: capacity shrinks racing reservations
// never leave a node holding more than its capacity.
func TestConcurrentReserveAndApplyNode(t *testing.T) {
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := mk(t)
			e.applyNode(t, nodeReq("hv1", 20000, 20*gib, 0))
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					_, _ = e.p.ReserveCompute(ctx, "hv1", fmt.Sprintf("vm%02d", i), compute(1000, gib))
				})
			}
			shrunk := make(chan error, 1)
			wg.Go(func() {
				_, err := e.p.ApplyNode(ctx, nodeReq("hv1", 5000, 5*gib, 0))
				shrunk <- err
			})
			wg.Wait()
			node, err := e.p.GetNode(ctx, "hv1")
			if err != nil {
				t.Fatal(err)
			}
			u := usage(node)
			if u.reqCPU > uint64(node.GetCpuMilliCores()) || u.reqMem > node.GetMemoryBytes() {
				t.Errorf("node holds %d milli / %d bytes with capacity %d / %d", u.reqCPU, u.reqMem, node.GetCpuMilliCores(), node.GetMemoryBytes())
			}
			if err := <-shrunk; err == nil && node.GetCpuMilliCores() != 5000 {
				t.Errorf("shrink succeeded but capacity is %d", node.GetCpuMilliCores())
			} else if err != nil && !errors.Is(err, apierr.ErrPrecondition) {
				t.Errorf("shrink: %v", err)
			}
		})
	}
}
