package etcd

import (
	"context"
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

func TestSnapshot(t *testing.T) {
	c := etcdtest.New(t, 1)
	storetest.RunSnapshot(t, func(t *testing.T) store.Store { return openOn(t, c, "") })
}

// TestSnapshotSkipsElection: the leader election's lease-bound keys under
// the prefix are not records and stay out of a snapshot.
func TestSnapshotSkipsElection(t *testing.T) {
	c := etcdtest.New(t, 1)
	s := openOn(t, c, "")
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Put(ctx, "/a", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Put(ctx, s.prefix+electionKey+"/694d", "candidate"); err != nil {
		t.Fatal(err)
	}
	_, kvs, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 1 || kvs[0].Key != "/a" {
		t.Fatalf("snapshot %v, want only /a", kvs)
	}
}
