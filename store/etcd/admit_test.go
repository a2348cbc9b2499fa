package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestAdmissionRefusesPastItsBounds: with every turn taken, a request waits
// at most the admission wait and is then refused as ResourceExhausted with
// a retry hint; with the queue full one is refused at once; a turn given
// back admits the next waiter.
func TestAdmissionRefusesPastItsBounds(t *testing.T) {
	a := newAdmission(minInFlight, 1, 100*time.Millisecond, time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	for range minInFlight {
		if err := a.acquire(ctx, "put", "k"); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err := a.acquire(ctx, "put", "k")
	if !errors.Is(err, apierr.ErrExhausted) || !errors.Is(err, store.ErrBusy) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("waiting past the admission wait: %v after %s, want ResourceExhausted after 100ms", err, time.Since(start))
	}
	waiter := make(chan error, 1)
	go func() {
		err := a.acquire(ctx, "put", "waiter")
		if err == nil {
			a.release(time.Millisecond, false)
		}
		waiter <- err
	}()
	for {
		a.mu.Lock()
		n := len(a.queue)
		a.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	if err := a.acquire(ctx, "put", "k"); !errors.Is(err, apierr.ErrExhausted) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("queue full: %v after %s, want an immediate ResourceExhausted", err, time.Since(start))
	}
	a.release(time.Millisecond, false)
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter was not admitted when the turn came back: %v", err)
	}
	if got := a.refused.Load(); got != 2 {
		t.Fatalf("refused %d, want 2", got)
	}
}

// TestAdmissionAdapts: slow answers cut the bound by a quarter at most
// once per target, down to its floor; quick ones raise it additively up to
// its ceiling; a cut bound admits no more than it allows.
func TestAdmissionAdapts(t *testing.T) {
	a := newAdmission(64, 100, time.Second, 10*time.Millisecond, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if err := a.acquire(ctx, "get", "k"); err != nil {
		t.Fatal(err)
	}
	a.release(20*time.Millisecond, false) // over the target
	if got := a.bound(); got != 48 {
		t.Fatalf("after a slow answer the bound is %d, want 48", got)
	}
	a.acquire(ctx, "get", "k")
	a.release(time.Second, true) // at once again: not cut twice in one target
	if got := a.bound(); got != 48 {
		t.Fatalf("a second slow answer within the target cut again: %d", got)
	}
	for range 40 {
		time.Sleep(11 * time.Millisecond)
		a.acquire(ctx, "get", "k")
		a.release(0, true) // out of time
	}
	if got := a.bound(); got != minInFlight {
		t.Fatalf("after many slow answers the bound is %d, want the floor %d", got, minInFlight)
	}
	for range 10_000 {
		a.acquire(ctx, "get", "k")
		a.release(time.Millisecond, false)
	}
	if got := a.bound(); got != 64 {
		t.Fatalf("after many quick answers the bound is %d, want the ceiling 64", got)
	}
}

// TestAdmissionQueuesAStorm: 400 concurrent writes through a store that
// admits 4 at a time all commit (they queue; none expires), and never more
// than 4 are at etcd at once.
func TestAdmissionQueuesAStorm(t *testing.T) {
	c := etcdtest.New(t, 1)
	s, err := Open(context.Background(), Options{Endpoints: c.Endpoints(), Prefix: "/storm", MaxInFlight: 4, AdmitWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		peak int
	)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s.adm.mu.Lock()
			n := s.adm.inFlight
			s.adm.mu.Unlock()
			mu.Lock()
			peak = max(peak, n)
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Put(ctx, fmt.Sprintf("/k/%03d", i), []byte("v"), 0); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	if len(errs) > 0 {
		t.Fatalf("%d of 400 writes failed, first: %v", len(errs), errs[0])
	}
	kvs, err := s.List(ctx, "/k/")
	if err != nil || len(kvs) != 400 {
		t.Fatalf("listed %d, %v; want 400", len(kvs), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak > 4 {
		t.Fatalf("%d requests at etcd at once, want at most 4", peak)
	}
}
