package mem

import (
	"fmt"
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

// historyEvents is the ring size of the stores RunHistory opens: small, so
// compacting means writing a few dozen records.
const historyEvents = 64

func TestHistoryContract(t *testing.T) {
	storetest.RunHistory(t, func(t *testing.T) store.Store { return NewWithHistory(historyEvents, 0) },
		func(t *testing.T, s store.Store) {
			for i := range historyEvents + 1 {
				if _, err := s.Put(t.Context(), fmt.Sprintf("compact/%d", i), []byte("x"), 0); err != nil {
					t.Fatal(err)
				}
			}
		})
}
