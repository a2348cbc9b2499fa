package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/etcdtest"
)

func elector(t *testing.T, c *etcdtest.Cluster, prefix, name string) (*Store, *Elector) {
	t.Helper()
	return electorTTL(t, c, prefix, name, 2*time.Second)
}

func electorTTL(t *testing.T, c *etcdtest.Cluster, prefix, name string, ttl time.Duration) (*Store, *Elector) {
	t.Helper()
	s := openOn(t, c, prefix)
	e, err := NewElector(s, name, ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, e
}

// leadAsync campaigns in the background; the channel yields the lead's
// context once won.
func leadAsync(ctx context.Context, e *Elector) <-chan context.Context {
	ch := make(chan context.Context, 1)
	go func() {
		lctx, err := e.Lead(ctx)
		if err == nil {
			ch <- lctx
		}
	}()
	return ch
}

func TestElection(t *testing.T) {
	c := etcdtest.New(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sa, a := elector(t, c, "/el", "a")
	sb, b := elector(t, c, "/el", "b")
	defer sb.Close()
	actx, acancel := context.WithCancel(ctx)
	la, err := a.Lead(actx)
	if err != nil {
		t.Fatal(err)
	}
	if name, err := b.Leader(ctx); err != nil || name != "a" {
		t.Fatalf("Leader = %q, %v; want a", name, err)
	}
	lb := leadAsync(ctx, b)
	select {
	case <-lb:
		t.Fatal("b leads while a does")
	case <-time.After(500 * time.Millisecond):
	}

	t.Run("crash", func(t *testing.T) {
		// a's client goes away without resigning (a crash): its lease
		// is no longer renewed, etcd expires it after the TTL and b leads.
		start := time.Now()
		sa.Close()
		var lctx context.Context
		select {
		case lctx = <-lb:
		case <-time.After(10 * time.Second):
			t.Fatal("b never took over")
		}
		took := time.Since(start)
		t.Logf("takeover after a crash: %s (lease TTL 2s)", took)
		if took > 5*time.Second {
			t.Errorf("takeover took %s with a 2s TTL", took)
		}
		select {
		case <-la.Done():
		case <-time.After(5 * time.Second):
			t.Error("a's lead context still alive after its client closed")
		}
		if name, err := b.Leader(ctx); err != nil || name != "b" {
			t.Fatalf("Leader = %q, %v; want b", name, err)
		}
		_ = lctx
	})
	acancel()

	t.Run("resign", func(t *testing.T) {
		// A graceful stop hands over at once, without waiting for the TTL
		// (10 s here, so that a loaded machine's slow handover is not
		// taken for an expiry).
		sd, d := electorTTL(t, c, "/el2", "d", 10*time.Second)
		defer sd.Close()
		se, e := electorTTL(t, c, "/el2", "e", 10*time.Second)
		defer se.Close()
		dctx, dcancel := context.WithCancel(ctx)
		ld, err := d.Lead(dctx)
		if err != nil {
			t.Fatal(err)
		}
		le := leadAsync(ctx, e)
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		dcancel()
		<-ld.Done()
		select {
		case <-le:
		case <-time.After(10 * time.Second):
			t.Fatal("e never took over")
		}
		took := time.Since(start)
		t.Logf("takeover after a graceful stop: %s", took)
		if took > 5*time.Second {
			t.Errorf("graceful takeover took %s: the lead was not resigned (the TTL is 10 s)", took)
		}
	})
}

func TestElectorRefusesBadTTL(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 1500 * time.Millisecond, -time.Second} {
		if _, err := NewElector(&Store{}, "a", ttl, nil); err == nil {
			t.Errorf("TTL %s accepted", ttl)
		}
	}
}
