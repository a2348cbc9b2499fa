package lograte

import (
	"sync"
	"testing"
	"time"
)

func TestCounterReportsFirstThenCounts(t *testing.T) {
	c := &Counter{Interval: time.Hour}
	var reports []int64
	for range 5 {
		c.Add(1, func(n int64) { reports = append(reports, n) })
	}
	if len(reports) != 1 || reports[0] != 1 {
		t.Fatalf("reports %v, want [1] (the first event, then held for the interval)", reports)
	}
	c = &Counter{Interval: time.Millisecond}
	reports = nil
	c.Add(1, func(n int64) { reports = append(reports, n) })
	c.Add(2, func(n int64) { reports = append(reports, n) })
	time.Sleep(5 * time.Millisecond)
	c.Add(4, func(n int64) { reports = append(reports, n) })
	if len(reports) != 2 || reports[0] != 1 || reports[1] != 6 {
		t.Fatalf("reports %v, want [1 6]: the second report carries what was held back", reports)
	}
}

func TestGateBurstThenSuppressedCount(t *testing.T) {
	g := NewGate(time.Hour, 2)
	for i := range 2 {
		if n, ok := g.Allow(); !ok || n != 0 {
			t.Fatalf("line %d of the burst: ok=%v suppressed=%d", i, ok, n)
		}
	}
	for range 3 {
		if _, ok := g.Allow(); ok {
			t.Fatal("a line past the burst was allowed")
		}
	}
	g.lim.SetLimit(1e9) // let the next one through
	time.Sleep(time.Millisecond)
	if n, ok := g.Allow(); !ok || n != 3 {
		t.Fatalf("after the interval: ok=%v suppressed=%d, want true 3", ok, n)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := &Counter{}
	g := NewGate(time.Hour, 1)
	var total int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Add(1, func(n int64) { mu.Lock(); total += n; mu.Unlock() })
				g.Allow()
			}
		}()
	}
	wg.Wait()
	if total < 1 || total > 800 {
		t.Fatalf("reported %d events", total)
	}
}
