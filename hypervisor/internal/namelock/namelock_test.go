package namelock

import (
	"fmt"
	"sync"
	"testing"
)

// TestLock: holders of one name never overlap, different names do not
// wait for each other, and the table is empty once everyone is done.
func TestLock(t *testing.T) {
	var tb Table
	const names, workers, rounds = 4, 8, 200
	counts := make([]int, names) // guarded by the name's lock only
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				i := (w + r) % names
				unlock := tb.Lock(fmt.Sprint("vm", i))
				counts[i]++ // the race detector flags overlapping holders
				unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	if total != workers*rounds {
		t.Fatalf("%d increments, want %d", total, workers*rounds)
	}
	if len(tb.m) != 0 {
		t.Fatalf("table keeps %d entries after every lock was released", len(tb.m))
	}

	// Another name is free while one is held.
	unlock := tb.Lock("a")
	tb.Lock("b")()
	unlock()
}
