package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestFleetOnEtcd runs two appliances' runners and owners, each on its own
// client of a real three-member etcd cluster, and the leader's dispatcher
// on the first. The machines are split between the two runners; the
// second then crashes (no graceful delete) and its machines are
// re-dispatched to the first within Expiry + Interval of the crash, which
// the first's owner then holds.
func TestFleetOnEtcd(t *testing.T) {
	const (
		machines = 24
		beat     = 300 * time.Millisecond
		expiry   = 1500 * time.Millisecond
		interval = 500 * time.Millisecond // the dispatcher's
	)
	c := etcdtest.New(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *etcd.Store {
		st, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: "/fleet-test"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st1, st2 := open(), open()
	inv, err := inventory.New(inventory.Config{Store: st1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range machines {
		if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: fmt.Sprintf("m%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}

	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	o1 := &Owner{Store: st1, Self: "a1", Logger: log}
	o2 := &Owner{Store: st2, Self: "a2", Logger: log}
	r1 := &Runner{Store: st1, Self: appliance("a1", "127.0.0.1:1", nil, nil), Interval: beat, Expiry: expiry, Load: o1.Count, Logger: log}
	r2 := &Runner{Store: st2, Self: appliance("a2", "127.0.0.1:2", nil, nil), Interval: beat, Expiry: expiry, Load: o2.Count, Logger: log, crash: true}
	d := &Dispatcher{Store: st1, Self: "a1", Expiry: expiry, Interval: interval, Logger: log}

	run := func(f func(context.Context) error) (stop func()) {
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f(rctx) }()
		return func() {
			rcancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	defer run(o1.Run)()
	defer run(o2.Run)()
	defer run(r1.Run)()
	crash2 := run(r2.Run)
	waitFor(t, 10*time.Second, "both runners registered", func() bool {
		_, ok1 := readAppliance(t, st1, "a1")
		_, ok2 := readAppliance(t, st1, "a2")
		return ok1 && ok2
	})
	defer run(d.Run)()

	waitFor(t, 10*time.Second, "every machine owned by one of the two", func() bool {
		return o1.Count()+o2.Count() == machines && o1.Count() == machines/2
	})
	for i := range machines {
		m := fmt.Sprintf("m%02d", i)
		if o1.Owns(m) == o2.Owns(m) {
			t.Errorf("%s: owned by a1 %v, by a2 %v; want exactly one", m, o1.Owns(m), o2.Owns(m))
		}
	}

	// a2 crashes: its record stays and expires.
	crash2()
	crashed := time.Now()
	waitFor(t, expiry+interval, "a2's machines re-dispatched to a1 within Expiry + Interval", func() bool {
		return o1.Count() == machines
	})
	took := time.Since(crashed)
	t.Logf("a2's machines re-dispatched %s after it crashed", took.Round(time.Millisecond))
	if _, ok := readAppliance(t, st1, "a2"); !ok {
		t.Error("a crashed runner's record was deleted")
	}
	// The dispatcher notes a re-dispatch once its writes returned, which
	// may be just after the owner saw them through its watch.
	waitFor(t, 5*time.Second, "the re-dispatch noted", func() bool { return len(d.Redispatches()) > 0 })
	redo := d.Redispatches()
	if len(redo) != 1 || redo[0].Runner != "a2" || redo[0].Machines != machines/2 || redo[0].Left {
		t.Fatalf("Redispatches = %+v, want one of a2's %d machines", redo, machines/2)
	}
	t.Logf("re-dispatch %s after a2's last heartbeat (expiry %s)", redo[0].After.Round(time.Millisecond), expiry)
	if redo[0].After < expiry {
		t.Errorf("re-dispatched %s after the last heartbeat, before the expiry %s", redo[0].After, expiry)
	}
	for i := range machines {
		if m := fmt.Sprintf("m%02d", i); o2.Owns(m) {
			t.Errorf("%s still owned by a2", m)
		}
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// BenchmarkRedispatchAfterCrash measures the work re-dispatch time after a
// runner dies, at the production settings (heartbeat 10 s, expiry 30 s,
// dispatcher interval 5 s) on a real 3-member etcd: two runners share
// 1,000 machines, one crashes, and the time until its machines are all
// assigned to the other is reported from its crash and from its last
// heartbeat. One iteration takes about 45 s; run it with -benchtime=1x.
func BenchmarkRedispatchAfterCrash(b *testing.B) {
	const machines = 1000
	c := etcdtest.New(b, 3)
	ctx := context.Background()
	open := func() *etcd.Store {
		st, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: "/fleet-bench"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}
	st1, st2 := open(), open()
	inv, err := inventory.New(inventory.Config{Store: st1})
	if err != nil {
		b.Fatal(err)
	}
	for i := range machines {
		if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: fmt.Sprintf("m%04d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	var sinceCrash, sinceBeat time.Duration
	for i := range b.N {
		rctx, cancel := context.WithCancel(ctx)
		o1 := &Owner{Store: st1, Self: "a1"}
		r1 := &Runner{Store: st1, Self: appliance("a1", "", nil, nil), Load: o1.Count}
		c2, crash := context.WithCancel(rctx)
		r2 := &Runner{Store: st2, Self: appliance(fmt.Sprintf("a2-%d", i), "", nil, nil), crash: true}
		d := &Dispatcher{Store: st1, Self: "a1"}
		done := make(chan struct{}, 4)
		for _, f := range []func() error{func() error { return o1.Run(rctx) }, func() error { return r1.Run(rctx) }, func() error { return r2.Run(c2) }} {
			go func() { _ = f(); done <- struct{}{} }()
		}
		for {
			_, e1 := st1.Get(ctx, AppliancePrefix+"a1")
			_, e2 := st1.Get(ctx, AppliancePrefix+r2.Self.GetName())
			if e1 == nil && e2 == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		go func() { _ = d.Run(rctx); done <- struct{}{} }()
		for o1.Count() == 0 || o1.Count() == machines {
			time.Sleep(10 * time.Millisecond)
		}
		b.ResetTimer()
		crash()
		crashed := time.Now()
		for o1.Count() != machines {
			time.Sleep(10 * time.Millisecond)
		}
		sinceCrash += time.Since(crashed)
		if r := d.Redispatches(); len(r) > 0 {
			sinceBeat += r[len(r)-1].After
		}
		b.StopTimer()
		cancel()
		for range 4 {
			<-done
		}
		// Start the next iteration from no assignments and no crashed
		// runner (assignments of live runners never move).
		kvs, err := st1.List(ctx, AssignmentPrefix)
		if err != nil {
			b.Fatal(err)
		}
		kv2, _ := st1.Get(ctx, AppliancePrefix+r2.Self.GetName())
		for _, kv := range append(kvs, kv2) {
			if err := st1.Delete(ctx, kv.Key, kv.Revision); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(sinceCrash.Seconds()/float64(b.N), "s-after-crash")
	b.ReportMetric(sinceBeat.Seconds()/float64(b.N), "s-after-last-beat")
}
