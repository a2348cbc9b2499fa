package metrics

import "github.com/prometheus/client_golang/prometheus"

// eraseLevels and eraseOutcomes are the label values of
// corral_erases_total (lifecycle's erase levels and outcomes); anything
// else is counted as "other", so a label's values stay bounded.
var (
	eraseLevels   = []string{"quick", "full", "secure"}
	eraseOutcomes = []string{"ok", "failed", "timeout"}
)

// newEraseCounter makes corral_erases_total, registered on reg.
func newEraseCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_erases_total",
		Help: "Finished disk erases of released machines, by level (quick, full, secure) and outcome (ok; failed: the agent reported an error; timeout: --erase-timeout or no progress for 30 min)."},
		[]string{"level", "outcome"})
	for _, l := range eraseLevels {
		for _, o := range eraseOutcomes {
			c.WithLabelValues(l, o)
		}
	}
	reg.MustRegister(c)
	return c
}

// EraseDone returns what the lifecycle calls for each finished erase
// (lifecycle.Config.EraseDone; nil on a nil *Metrics).
func (o *Metrics) EraseDone() func(level, outcome string) {
	if o == nil {
		return nil
	}
	c := o.erases
	return func(level, outcome string) {
		c.WithLabelValues(bounded(level, eraseLevels), bounded(outcome, eraseOutcomes)).Inc()
	}
}

func bounded(v string, known []string) string {
	for _, k := range known {
		if v == k {
			return v
		}
	}
	return "other"
}
