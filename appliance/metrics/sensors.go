package metrics

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// SensorKinds bounds the kind label of the sensor gauges (ipmi's kinds).
var SensorKinds = []string{"temperature", "fan", "power", "power-supply", "current", "voltage", "other"}

// SensorReading is one sensor of a machine's last health read, as the
// gauges take it.
type SensorReading struct {
	Kind   string
	Value  float64
	Status string // ok, warning, critical
}

// sensorGauges keeps each machine's last health read and reports it per
// machine and sensor kind (never per sensor: the labels stay bounded
// whatever a BMC names its sensors): the highest and lowest reading, and
// how many sensors are past a threshold.
type sensorGauges struct {
	mu               sync.Mutex
	last             map[string][]SensorReading
	maxD, minD, notD *prometheus.Desc
}

func newSensorGauges() *sensorGauges {
	return &sensorGauges{last: map[string][]SensorReading{},
		maxD: prometheus.NewDesc("corral_bmc_sensor_max", "Highest reading of a machine's BMC sensors of one kind at the last health poll (degrees C, RPM, watts, amperes, volts).", []string{"machine", "kind"}, nil),
		minD: prometheus.NewDesc("corral_bmc_sensor_min", "Lowest reading of a machine's BMC sensors of one kind at the last health poll.", []string{"machine", "kind"}, nil),
		notD: prometheus.NewDesc("corral_bmc_sensors_not_ok", "A machine's BMC sensors of one kind past a threshold (warning or critical) at the last health poll.", []string{"machine", "kind"}, nil),
	}
}

func (g *sensorGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.maxD
	ch <- g.minD
	ch <- g.notD
}

func (g *sensorGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for machine, rs := range g.last {
		type agg struct {
			max, min float64
			not      int
			n        int
		}
		by := map[string]*agg{}
		for _, r := range rs {
			a := by[r.Kind]
			if a == nil {
				a = &agg{max: r.Value, min: r.Value}
				by[r.Kind] = a
			}
			a.max, a.min, a.n = max(a.max, r.Value), min(a.min, r.Value), a.n+1
			if r.Status != "ok" {
				a.not++
			}
		}
		for kind, a := range by {
			ch <- prometheus.MustNewConstMetric(g.maxD, prometheus.GaugeValue, a.max, machine, kind)
			ch <- prometheus.MustNewConstMetric(g.minD, prometheus.GaugeValue, a.min, machine, kind)
			ch <- prometheus.MustNewConstMetric(g.notD, prometheus.GaugeValue, float64(a.not), machine, kind)
		}
	}
}

// Sensors returns what health polling calls with each machine's readings
// (nil readings forget the machine); nil on a nil *Metrics. Kinds outside
// SensorKinds count as other.
func (o *Metrics) Sensors() func(machine string, readings []SensorReading) {
	if o == nil {
		return nil
	}
	g := o.sensors
	return func(machine string, readings []SensorReading) {
		for i := range readings {
			if !slices.Contains(SensorKinds, readings[i].Kind) {
				readings[i].Kind = "other"
			}
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if readings == nil {
			delete(g.last, machine)
			return
		}
		g.last[machine] = readings
	}
}
