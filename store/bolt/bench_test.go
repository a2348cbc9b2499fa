package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/corralhq/corral/store"
)

func benchStore(b *testing.B, opts Options) *Store {
	b.Helper()
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func reportOps(b *testing.B, ops int64) {
	b.ReportMetric(float64(ops)/b.Elapsed().Seconds(), "ops/s")
}

// Benchmark measures durable write throughput. Every write is fsynced
// before it returns, so the figures depend mostly on the disk. Each case
// runs without corrald's commit window (window.go), with it (the API's
// writes: they never wait for it), and with it and every write made under
// WithCommitWindow (as DHCP's are; these writers are a closed loop, each
// waiting for its answer, which a window caps at their number per window).
func Benchmark(b *testing.B) {
	for _, w := range []struct {
		name    string
		opts    Options
		mayWait bool
	}{
		{"nowindow", Options{}, false},
		{"window", Options{CommitWindow: DefaultCommitWindow}, false},
		{"window-mayWait", Options{CommitWindow: DefaultCommitWindow}, true},
	} {
		b.Run(w.name, func(b *testing.B) { benchWrites(b, w.opts, w.mayWait) })
	}
}

func benchWrites(b *testing.B, opts Options, mayWait bool) {
	ctxFor := func(b *testing.B) context.Context {
		if mayWait {
			return store.WithCommitWindow(b.Context())
		}
		return b.Context()
	}
	// SequentialPut: one writer, so every Put is its own commit.
	b.Run("SequentialPut", func(b *testing.B) {
		s := benchStore(b, opts)
		ctx := ctxFor(b)
		val := make([]byte, 128)
		var rev int64
		var n int64
		for b.Loop() {
			var err error
			if rev, err = s.Put(ctx, "seq", val, rev); err != nil {
				b.Fatal(err)
			}
			n++
		}
		reportOps(b, n)
	})

	// ParallelCASIncrement: GOMAXPROCS goroutines (times -cpu), each doing
	// read-modify-write compare-and-swap increments of its own counter;
	// their writes share commits.
	b.Run("ParallelCASIncrement", func(b *testing.B) {
		s := benchStore(b, opts)
		ctx := ctxFor(b)
		var next, done atomic.Int64
		b.SetParallelism(8)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			key := fmt.Sprintf("ctr/%d", next.Add(1))
			for pb.Next() {
				for {
					var cur int64
					n := 0
					kv, err := s.Get(ctx, key)
					switch {
					case err == nil:
						cur = kv.Revision
						if n, err = strconv.Atoi(string(kv.Value)); err != nil {
							b.Error(err)
							return
						}
					case !errors.Is(err, store.ErrNotFound):
						b.Error(err)
						return
					}
					_, err = s.Put(ctx, key, []byte(strconv.Itoa(n+1)), cur)
					if err == nil {
						done.Add(1)
						break
					}
					if !errors.Is(err, store.ErrConflict) {
						b.Error(err)
						return
					}
				}
			}
		})
		reportOps(b, done.Load())
	})
}
