package keyrate

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestTableLimitsEachKey(t *testing.T) {
	tab := New(1, 3, 10)
	now := time.Unix(1_000_000, 0)
	allowed := map[string]int{}
	for range 10 {
		for _, k := range []string{"a", "b"} {
			if tab.Allow(k, now) {
				allowed[k]++
			}
		}
	}
	if allowed["a"] != 3 || allowed["b"] != 3 {
		t.Fatalf("allowed %v at once; want the burst, 3 each", allowed)
	}
	if !tab.Allow("a", now.Add(time.Second)) || tab.Allow("a", now.Add(time.Second)) {
		t.Fatal("after 1 s at 1/s: want one more call, then none")
	}
}

func TestTableIsBounded(t *testing.T) {
	tab := New(1, 1, 100)
	now := time.Unix(1_000_000, 0)
	tab.Allow("flooder", now)
	for i := range 1000 {
		tab.Allow(fmt.Sprint("spoofed-", i), now)
		if i%50 == 0 {
			tab.Allow("flooder", now) // used again: never the least recent
		}
	}
	if n := tab.Len(); n != 100 {
		t.Fatalf("Len %d after 1,001 keys; want the bound, 100", n)
	}
	if f := tab.Forgotten(); f != 901 {
		t.Fatalf("Forgotten %d; want 901", f)
	}
	if tab.Allow("flooder", now) {
		t.Fatal("the flooder's empty bucket was forgotten while it kept calling")
	}
}

func TestTableConcurrent(t *testing.T) {
	tab := New(0, 50, 8)
	now := time.Unix(1_000_000, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if tab.Allow("k", now) {
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if n != 50 {
		t.Fatalf("%d calls allowed from 8 goroutines; want the burst, 50", n)
	}
}
