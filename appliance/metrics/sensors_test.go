package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// collectSensors returns max|min|not_ok{kind} → value of g's series.
func collectSensors(t *testing.T, g *sensorGauges) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(g)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name := strings.TrimPrefix(strings.TrimPrefix(mf.GetName(), "corral_bmc_sensor_"), "corral_bmc_sensors_")
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 || labels["machine"] == "" || labels["kind"] == "" {
				t.Fatalf("labels %v: want machine and kind only", labels)
			}
			out[name+"{"+labels["kind"]+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestSensorGauges: readings are reported per machine and kind (an
// unknown kind as other), never per sensor; a forgotten machine goes.
func TestSensorGauges(t *testing.T) {
	o := New(Config{}, nil)
	set := o.Sensors()
	set("m1", []SensorReading{{Kind: "temperature", Value: 40, Status: "ok"}, {Kind: "temperature", Value: 95, Status: "critical"},
		{Kind: "fan", Value: 6000, Status: "ok"}, {Kind: "flux", Value: 1, Status: "ok"}})
	got := collectSensors(t, o.sensors)
	want := map[string]float64{"max{temperature}": 95, "min{temperature}": 40, "not_ok{temperature}": 1,
		"max{fan}": 6000, "min{fan}": 6000, "not_ok{fan}": 0, "max{other}": 1, "min{other}": 1, "not_ok{other}": 0}
	if len(got) != len(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	set("m1", nil)
	if got := collectSensors(t, o.sensors); len(got) != 0 {
		t.Fatalf("series after the machine was forgotten: %v", got)
	}
}
