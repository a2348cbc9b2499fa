package etcd

import (
	"testing"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/storetest"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

func TestPagerContract(t *testing.T) {
	c := etcdtest.New(t, 1)
	storetest.RunPager(t, func(t *testing.T) store.Store { return openOn(t, c, "") })
}
