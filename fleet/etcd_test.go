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
