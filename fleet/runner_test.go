package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// runRunner starts r and returns a stop that cancels it and returns its
// error.
func runRunner(r *Runner) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

func readAppliance(t *testing.T, st store.Store, name string) (*fleetv1.Appliance, bool) {
	t.Helper()
	a := &fleetv1.Appliance{}
	_, err := record.Get(context.Background(), st, AppliancePrefix+name, a)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return a, true
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunnerHeartbeatsAndLeaves: the record appears at start with the
// spec, started_at and load, its heartbeat advances, and a graceful stop
// deletes it.
func TestRunnerHeartbeatsAndLeaves(t *testing.T) {
	st := mem.New()
	defer st.Close()
	self := appliance("a1", "10.0.0.1:20180", []string{"10.0.0.0/24"}, []string{"192.168.0.0/24"})
	self.Version = "v1.2.3"
	r := &Runner{Store: st, Self: self, Interval: 20 * time.Millisecond, Expiry: time.Second, Load: func() int { return 7 }}
	stop := runRunner(r)
	var first *fleetv1.Appliance
	waitFor(t, time.Second, "record written", func() bool {
		first, _ = readAppliance(t, st, "a1")
		return first != nil
	})
	spec := proto.CloneOf(first)
	spec.StartedAt, spec.LastHeartbeat, spec.Load = nil, nil, 0
	if !proto.Equal(spec, self) {
		t.Errorf("record spec %v, want %v", spec, self)
	}
	if first.GetLoad() != 7 || first.GetStartedAt() == nil {
		t.Errorf("record %v: want load 7 and started_at", first)
	}
	waitFor(t, time.Second, "heartbeat advances", func() bool {
		a, _ := readAppliance(t, st, "a1")
		return a.GetLastHeartbeat().AsTime().After(first.GetLastHeartbeat().AsTime())
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := readAppliance(t, st, "a1"); ok {
		t.Error("record still there after a graceful stop")
	}
}

// TestRunnerNameInUse: a second appliance configured with a live name is
// refused with a clear error and does not touch the record; a crashed
// predecessor's record is taken over once it expires.
func TestRunnerNameInUse(t *testing.T) {
	st := mem.New()
	defer st.Close()
	first := &Runner{Store: st, Self: appliance("a1", "10.0.0.1:20180", nil, nil), Interval: 20 * time.Millisecond, Expiry: 200 * time.Millisecond}
	stopFirst := runRunner(first)
	defer stopFirst()
	waitFor(t, time.Second, "first registered", func() bool { _, ok := readAppliance(t, st, "a1"); return ok })

	second := &Runner{Store: st, Self: appliance("a1", "10.0.0.2:20180", nil, nil), Interval: 20 * time.Millisecond, Expiry: 200 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := second.Run(ctx)
	if !errors.Is(err, ErrNameInUse) {
		t.Fatalf("second appliance with the name: %v, want ErrNameInUse", err)
	}
	for _, want := range []string{`"a1"`, "10.0.0.1:20180", "--appliance-name"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if a, _ := readAppliance(t, st, "a1"); a.GetApiEndpoint() != "10.0.0.1:20180" {
		t.Errorf("the refused appliance overwrote the record: %v", a)
	}
}

func TestRunnerTakesOverExpiredRecord(t *testing.T) {
	st := mem.New()
	defer st.Close()
	// A predecessor that crashed 100 ms ago with a 300 ms expiry.
	old := appliance("a1", "10.0.0.1:20180", nil, nil)
	old.StartedAt = timestamppb.New(time.Now().Add(-time.Hour))
	old.LastHeartbeat = timestamppb.New(time.Now().Add(-100 * time.Millisecond))
	if _, err := record.Put(context.Background(), st, AppliancePrefix+"a1", old, 0); err != nil {
		t.Fatal(err)
	}
	r := &Runner{Store: st, Self: appliance("a1", "10.0.0.1:20180", nil, nil), Interval: 50 * time.Millisecond, Expiry: 300 * time.Millisecond}
	start := time.Now()
	stop := runRunner(r)
	waitFor(t, 2*time.Second, "record taken over", func() bool {
		a, _ := readAppliance(t, st, "a1")
		return !proto.Equal(a.GetStartedAt(), old.GetStartedAt())
	})
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("took the live record over after %s, before it expired", took)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRunnerRefusesBadConfig(t *testing.T) {
	st := mem.New()
	defer st.Close()
	tests := map[string]struct {
		r    *Runner
		want string
	}{
		"no name":            {&Runner{Store: st, Self: appliance("", "", nil, nil)}, "appliance name is required"},
		"bad bmc network":    {&Runner{Store: st, Self: appliance("a1", "", []string{"10.0.0.1"}, nil)}, `BMC network (--bmc-network) "10.0.0.1" is not a CIDR`},
		"expiry not > beats": {&Runner{Store: st, Self: appliance("a1", "", nil, nil), Interval: time.Second, Expiry: time.Second}, "must be longer than the heartbeat interval"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := tt.r.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if kvs, _ := st.List(context.Background(), AppliancePrefix); len(kvs) != 0 {
		t.Errorf("a refused runner wrote %d records", len(kvs))
	}
}
