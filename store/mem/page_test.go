package mem

import (
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
)

func TestPagerContract(t *testing.T) {
	storetest.RunPager(t, func(t *testing.T) store.Store { return New() })
}
