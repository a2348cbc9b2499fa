package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// standbyPoolsPrefix holds the standby pool records (lifecycle/standby
// owns them; read by prefix here, not imported).
const standbyPoolsPrefix = store.StandbyPoolsPrefix

// standbyReadTimeout bounds a scrape's read of the pool records.
const standbyReadTimeout = 2 * time.Second

// standbyGauges reports each standby pool's status as the leader's
// controller last wrote it on the pool's record: a scrape reads the few
// pool records, so every appliance of a fleet reports the same figures.
type standbyGauges struct {
	st                             atomic.Pointer[store.Store]
	readyDesc, targetDesc, deficit *prometheus.Desc
}

func newStandbyGauges() *standbyGauges {
	return &standbyGauges{
		readyDesc:  prometheus.NewDesc("corral_standby_pool_ready", "READY machines of a standby pool, as its controller last counted them.", []string{"pool"}, nil),
		targetDesc: prometheus.NewDesc("corral_standby_pool_target", "A standby pool's min_ready.", []string{"pool"}, nil),
		deficit:    prometheus.NewDesc("corral_standby_pool_deficit", "READY machines a standby pool lacks in its readiness (booted, for a booted pool).", []string{"pool"}, nil),
	}
}

// follow makes the gauges read st.
func (g *standbyGauges) follow(st store.Store) { g.st.Store(&st) }

func (g *standbyGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.readyDesc
	ch <- g.targetDesc
	ch <- g.deficit
}

func (g *standbyGauges) Collect(ch chan<- prometheus.Metric) {
	st := g.st.Load()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), standbyReadTimeout)
	defer cancel()
	pools, err := record.List(ctx, *st, standbyPoolsPrefix, func() *inventoryv1.StandbyPool { return &inventoryv1.StandbyPool{} })
	if err != nil {
		return
	}
	for _, p := range pools {
		ch <- prometheus.MustNewConstMetric(g.readyDesc, prometheus.GaugeValue, float64(p.GetStatus().GetReady()), p.GetName())
		ch <- prometheus.MustNewConstMetric(g.targetDesc, prometheus.GaugeValue, float64(p.GetMinReady()), p.GetName())
		ch <- prometheus.MustNewConstMetric(g.deficit, prometheus.GaugeValue, float64(p.GetStatus().GetDeficit()), p.GetName())
	}
}
