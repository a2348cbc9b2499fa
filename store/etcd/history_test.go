package etcd

import (
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestHistoryContract runs on a cluster of its own: compaction is
// cluster-wide.
func TestHistoryContract(t *testing.T) {
	c := etcdtest.New(t, 1)
	storetest.RunHistory(t, func(t *testing.T) store.Store { return openOn(t, c, "") },
		func(t *testing.T, s store.Store) {
			e := s.(*Store)
			// Compacting at a fresh write's revision removes every
			// revision before it: nothing earlier can be resumed after.
			resp, err := e.Client().Put(t.Context(), "compact-probe", "x")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Client().Compact(t.Context(), resp.Header.Revision); err != nil {
				t.Fatal(err)
			}
		})
}
