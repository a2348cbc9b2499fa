package bolt

import (
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

func TestPagerContract(t *testing.T) {
	storetest.RunPager(t, func(t *testing.T) store.Store {
		s, _ := openTemp(t)
		return s
	})
}

// TestPagerContractNoJournal: the same when every batch commits to bbolt
// directly, so pages read bbolt rather than the commit window.
func TestPagerContractNoJournal(t *testing.T) {
	storetest.RunPager(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "corral.db"), Options{NoJournal: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
