package mem

import (
	"context"
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New() })
}

// TestSlowWatcherDropped checks that a watcher that stops reading is
// disconnected once its buffer is full, without blocking writers or
// affecting a watcher that keeps up.
func TestSlowWatcherDropped(t *testing.T) {
	const buf = 4
	s := New()
	defer s.Close()
	ctx := t.Context()

	s.hub.SetBuffer(buf)
	slow, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// The other watcher has room for every event, so it is never dropped.
	s.hub.SetBuffer(3 * buf)
	fast, err := s.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	fastGot := make(chan int)
	go func() {
		n := 0
		for range fast {
			n++
			if n == 3*buf {
				break
			}
		}
		fastGot <- n
	}()

	var rev int64
	for range 3 * buf {
		if rev, err = s.Put(ctx, "k", []byte("v"), rev); err != nil {
			t.Fatal(err)
		}
	}
	if n := <-fastGot; n != 3*buf {
		t.Fatalf("fast watcher got %d events, want %d", n, 3*buf)
	}

	n := 0
	for range slow {
		n++
	}
	if n != buf {
		t.Fatalf("slow watcher got %d events before being closed, want %d", n, buf)
	}
}

func TestEmptyKeyRejected(t *testing.T) {
	s := New()
	defer s.Close()
	if _, err := s.Put(context.Background(), "", []byte("v"), 0); err == nil {
		t.Fatal("Put with empty key succeeded")
	}
}
