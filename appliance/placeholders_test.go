package appliance

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

func TestGCInterval(t *testing.T) {
	for after, want := range map[time.Duration]time.Duration{
		2 * time.Second: time.Second,
		8 * time.Second: 2 * time.Second,
		time.Hour:       10 * time.Minute,
		24 * time.Hour:  10 * time.Minute,
	} {
		if got := gcInterval(after); got != want {
			t.Errorf("gcInterval(%s) = %s, want %s", after, got, want)
		}
	}
}

// fakeCollector returns its results in turn, then zero sweeps.
type fakeCollector struct {
	mu    sync.Mutex
	calls int
	ages  []time.Duration
	out   []error
}

func (f *fakeCollector) CollectPlaceholders(_ context.Context, age time.Duration) (inventory.PlaceholderSweep, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.ages = append(f.ages, age)
	if len(f.out) == 0 {
		return inventory.PlaceholderSweep{}, nil
	}
	err := f.out[0]
	f.out = f.out[1:]
	return inventory.PlaceholderSweep{Machines: 3, Placeholders: 2, Deleted: 1}, err
}

// TestRunPlaceholderGC: a sweep at start, then one per tick; a failed
// sweep is logged and the next tick tries again; cancel stops it with nil.
func TestRunPlaceholderGC(t *testing.T) {
	var logs syncbuf.Buffer
	f := &fakeCollector{out: []error{nil, errors.New("store unavailable")}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runPlaceholderGC(ctx, f, time.Hour, 5*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		n := f.calls
		f.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps in 5s", n)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if f.ages[0] != time.Hour {
		t.Errorf("age %s", f.ages[0])
	}
	for _, want := range []string{"stale discovered machines collected", "deleted=1", "not all collected", "store unavailable"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
