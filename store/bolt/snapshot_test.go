package bolt

import (
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

func TestSnapshot(t *testing.T) {
	storetest.RunSnapshot(t, func(t *testing.T) store.Store {
		s, _ := openTemp(t)
		return s
	})
}
