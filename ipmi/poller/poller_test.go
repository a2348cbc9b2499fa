package poller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type fakeSource struct {
	names   []string
	mu      sync.Mutex
	seen    map[string]int
	cur     atomic.Int64
	peak    atomic.Int64
	failing map[string]bool
}

func (f *fakeSource) PowerTargets(context.Context) ([]string, error) { return f.names, nil }

func (f *fakeSource) RefreshPower(ctx context.Context, name string) error {
	n := f.cur.Add(1)
	defer f.cur.Add(-1)
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(5 * time.Millisecond)
	f.mu.Lock()
	f.seen[name]++
	f.mu.Unlock()
	if f.failing[name] {
		return fmt.Errorf("boom")
	}
	return nil
}

func TestPollBoundedAndComplete(t *testing.T) {
	f := &fakeSource{seen: map[string]int{}, failing: map[string]bool{"m3": true}}
	for i := range 40 {
		f.names = append(f.names, fmt.Sprintf("m%d", i))
	}
	p, err := New(Config{Source: f, Concurrency: 4, Interval: time.Second, Jitter: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Poll(context.Background())
	if r.Machines != 40 || r.Failed != 1 {
		t.Fatalf("round %+v", r)
	}
	if len(f.seen) != 40 {
		t.Fatalf("polled %d machines", len(f.seen))
	}
	if f.peak.Load() > 4 {
		t.Fatalf("concurrency peaked at %d, bound 4", f.peak.Load())
	}
}

func TestRunRepeatsAndStops(t *testing.T) {
	f := &fakeSource{names: []string{"a"}, seen: map[string]int{}}
	p, _ := New(Config{Source: f, Interval: 20 * time.Millisecond, Jitter: 0.5})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen["a"] < 3 {
		t.Fatalf("polled %d times in 200ms at a 20ms interval", f.seen["a"])
	}
}

func TestConfigRejectsBadJitter(t *testing.T) {
	if _, err := New(Config{Source: &fakeSource{}, Jitter: 2}); err == nil {
		t.Fatal("jitter 2 accepted")
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("nil source accepted")
	}
}

func TestPollFilter(t *testing.T) {
	tests := map[string]struct {
		filter func(string) bool
		want   map[string]int
	}{
		"nil polls all": {nil, map[string]int{"a": 1, "b": 1, "c": 1}},
		"only owned":    {func(n string) bool { return n != "b" }, map[string]int{"a": 1, "c": 1}},
		"none owned":    {func(string) bool { return false }, map[string]int{}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeSource{names: []string{"a", "b", "c"}, seen: map[string]int{}}
			p, err := New(Config{Source: f, Interval: time.Second, Jitter: 0.01, Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			r := p.Poll(context.Background())
			if r.Machines != len(tt.want) {
				t.Errorf("round counted %d machines, want %d", r.Machines, len(tt.want))
			}
			if diff := cmp.Diff(tt.want, f.seen); diff != "" {
				t.Errorf("polled (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"a", "b", "c"}, f.names); diff != "" {
				t.Errorf("the Source's list was modified:\n%s", diff)
			}
		})
	}
}
