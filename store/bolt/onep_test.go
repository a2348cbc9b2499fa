package bolt

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// TestOnePBurstSharesAFlush: with a single P (corrald on one core), a
// burst of writers that are all runnable at once is committed in a few
// batches, not one flush per write: the first writer yields before it
// commits, so the others queue first (commit.go, queue). Without the yield
// the journal's fdatasync holds the P (sync.go) and each writer commits
// alone. Every write is answered, in order of revisions, and survives a
// reopen, under one P as under many (TestCommitEveryWriteAnswered and the
// crash tests run with the default).
func TestOnePBurstSharesAFlush(t *testing.T) {
	tests := map[string]struct {
		writers    int
		maxCommits int64
	}{
		"64 writers":  {writers: 64, maxCommits: 8},
		"256 writers": {writers: 256, maxCommits: 16},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			if !oneP() {
				t.Fatal("GOMAXPROCS(1) did not take")
			}
			s, path := openTemp(t)
			defer s.Close()
			ctx := t.Context()
			start := make(chan struct{})
			errs := make(chan error, tc.writers)
			var wg sync.WaitGroup
			for w := range tc.writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := s.Put(ctx, fmt.Sprintf("k/%03d", w), []byte("v"), 0)
					errs <- err
				}()
			}
			before := s.commits.Load()
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("Put: %v", err)
				}
			}
			commits := s.commits.Load() - before
			if commits > tc.maxCommits {
				t.Errorf("%d writers released together took %d commits (flushes), want at most %d", tc.writers, commits, tc.maxCommits)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if got := len(listAll(t, s2)); got != tc.writers {
				t.Errorf("%d records after reopen, want %d", got, tc.writers)
			}
		})
	}
}
