package bolt

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	bbolt "go.etcd.io/bbolt"

	"github.com/corralhq/corral/store"
)

// TestReviewOversizedKey: a key longer than bbolt takes is refused with a
// clear error through the journal as without it. Before, the journal
// answered it, then every fold failed ("fold: key too large"), Close
// failed, and Open refused the store for good (the replay failed too).
// A key of bbolt's largest size goes through journal, crash, fold and
// Close.
func TestReviewOversizedKey(t *testing.T) {
	for name, opts := range map[string]Options{"journal": {}, "no journal": {NoJournal: true}} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "corral.db")
			s, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			long := strings.Repeat("k", bbolt.MaxKeySize+1)
			if _, err := s.Put(ctx, long, []byte("v"), 0); err == nil || !strings.Contains(err.Error(), "longer than") {
				t.Errorf("Put of a %d-byte key = %.200v, want a key-too-long error", len(long), err)
			}
			if _, err := s.Update(ctx, long, func(store.KV, bool) ([]byte, bool, error) { return []byte("v"), false, nil }); err == nil {
				t.Errorf("Update of a %d-byte key = nil, want an error", len(long))
			}
			edge := strings.Repeat("e", bbolt.MaxKeySize)
			if _, err := s.Put(ctx, edge, []byte("v"), 0); err != nil {
				t.Fatalf("Put of a %d-byte key: %v", len(edge), err)
			}
			want := listAll(t, s)
			s2, err := Open(crashCopy(t, path), Options{})
			if err != nil {
				t.Fatalf("Open after a crash: %.300v", err)
			}
			if diff := cmp.Diff(want, listAll(t, s2)); diff != "" {
				t.Errorf("after a crash (-answered +found):\n%s", diff)
			}
			s2.Close()
			if !opts.NoJournal {
				foldNow(t, s)
				want = listAll(t, s)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %.300v", err)
			}
			s3, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after Close: %.300v", err)
			}
			defer s3.Close()
			if diff := cmp.Diff(want, listAll(t, s3)); diff != "" {
				t.Fatalf("after Close and Open (-before +after):\n%s", diff)
			}
		})
	}
}
