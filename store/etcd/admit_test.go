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
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestAdmissionRefusesPastItsBounds: with every turn taken, a request waits
// at most the admission wait and is then refused as ResourceExhausted with
// a retry hint; with the queue full one is refused at once; a turn given
// back admits the next waiter.
func TestAdmissionRefusesPastItsBounds(t *testing.T) {
	a := newAdmission(1, 1, 100*time.Millisecond, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	release, err := a.acquire(ctx, "put", "k")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = a.acquire(ctx, "put", "k")
	if !errors.Is(err, apierr.ErrExhausted) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("waiting past the admission wait: %v after %s, want ResourceExhausted after 100ms", err, time.Since(start))
	}
	waiter := make(chan error, 1)
	go func() {
		r, err := a.acquire(ctx, "put", "waiter")
		if err == nil {
			r()
		}
		waiter <- err
	}()
	for a.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	if _, err := a.acquire(ctx, "put", "k"); !errors.Is(err, apierr.ErrExhausted) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("queue full: %v after %s, want an immediate ResourceExhausted", err, time.Since(start))
	}
	release()
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter was not admitted when the turn came back: %v", err)
	}
	if got := a.refused.Load(); got != 2 {
		t.Fatalf("refused %d, want 2", got)
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
			mu.Lock()
			peak = max(peak, len(s.adm.slots))
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
