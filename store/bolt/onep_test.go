package bolt

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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

// TestPwrite: the journal's write puts every byte at its offset, with one
// P (a raw system call) and with many (os.File.WriteAt), and reports a
// failed write with the file's name.
func TestPwrite(t *testing.T) {
	for name, procs := range map[string]int{"one P": 1, "many Ps": 4} {
		t.Run(name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			path := filepath.Join(t.TempDir(), "f")
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
			if err := pwrite(f, big, 4096); err != nil {
				t.Fatal(err)
			}
			if err := pwrite(f, []byte("head"), 10); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 4096+len(big))
			copy(want[10:], "head")
			copy(want[4096:], big)
			if !bytes.Equal(got, want) {
				t.Errorf("file holds %d bytes, not the %d written at their offsets", len(got), len(want))
			}
			ro, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer ro.Close()
			if err := pwrite(ro, []byte("x"), 0); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("write to a read-only file: %v, want an error naming %s", err, path)
			}
		})
	}
}
