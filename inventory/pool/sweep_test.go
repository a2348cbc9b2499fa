package pool

import (
	"context"
	"sync"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/mem"
)

func TestSweepMarksSilentNodesNotReady(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	p, err := New(Config{Store: mem.New(), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"quiet", "beating"} {
		if _, err := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: name, CpuMilliCores: 1000, MemoryBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	s := &Sweeper{Pool: p}
	advance(20 * time.Second)
	p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "beating", CpuMilliCores: 1000, MemoryBytes: 1 << 30})
	advance(15 * time.Second) // quiet: 35 s silent; beating: 15 s
	if err := s.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]poolv1.Node_NodeState{"quiet": poolv1.Node_NOT_READY, "beating": poolv1.Node_READY} {
		n, _ := p.GetNode(ctx, name)
		if n.GetState() != want {
			t.Errorf("%s: %v, want %v", name, n.GetState(), want)
		}
	}
	// No new placement on the NOT_READY node; a heartbeat brings it back.
	if _, err := p.ReserveCompute(ctx, "quiet", "c", &poolv1.Compute{RequestCpuMilliCore: 1, LimitCpuMilliCore: 1, RequestMemoryBytes: 1, LimitMemoryBytes: 1}); err == nil {
		t.Fatal("reservation on a NOT_READY node accepted")
	}
	n, _ := p.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "quiet", CpuMilliCores: 1000, MemoryBytes: 1 << 30})
	if n.GetState() != poolv1.Node_READY {
		t.Fatalf("heartbeat did not restore READY: %v", n.GetState())
	}
}
