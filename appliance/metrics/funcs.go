package metrics

import "github.com/prometheus/client_golang/prometheus"

// CounterFunc exports a count a component keeps itself (an atomic it
// adds to), read at each scrape, as the counter name with the constant
// labels; several components may export one name under different label
// values. It panics on a name or labels that clash with a registered
// metric: a wiring mistake, caught by the first test that starts the
// appliance.
func (o *Metrics) CounterFunc(name, help string, labels map[string]string, read func() uint64) {
	o.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
		func() float64 { return float64(read()) }))
}
