package ipmi_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/require"
)

// simSensors are a small server's sensors: a CPU temperature, a fan in
// RPM (50 per count) and the power draw in watts.
var simSensors = []ipmisim.Sensor{
	{Number: 1, Name: "CPU Temp", Type: 0x01, Unit: 1, Raw: 45, UNC: 80, UCR: 90},
	{Number: 2, Name: "Fan 1", Type: 0x04, Unit: 18, M: 50, Raw: 120, UNC: 250, UCR: 254, LCR: 10},
	{Number: 3, Name: "Power Draw", Type: 0x08, Unit: 6, M: 4, Raw: 50, UNC: 200, UCR: 230},
}

// TestSimHealth: ipmi_sim's SDR sensors read with their kinds, values and
// thresholds; a reading set over its critical threshold is critical; a
// critical event in the SEL is found, and an unchanged SEL is not read
// again.
func TestSimHealth(t *testing.T) {
	t.Parallel()
	b := ipmisim.StartWithSensors(t, ipmisim.Options{}, simSensors)
	c := nativeOnly()
	ctx := context.Background()
	tg := simTarget(b)
	h, a, err := c.Health(ctx, tg, ipmi.HealthOptions{})
	if err != nil {
		t.Fatalf("health: %v (%s)", err, a)
	}
	t.Logf("sensors: %+v; log at %s: %+v", h.Sensors, h.LogAddedAt, h.Log)
	want := map[string]struct {
		kind  string
		value float64
	}{"CPU Temp": {"temperature", 45}, "Fan 1": {"fan", 6000}, "Power Draw": {"power", 200}}
	if len(h.Sensors) != len(want) {
		t.Fatalf("read %d sensors, want %d: %+v", len(h.Sensors), len(want), h.Sensors)
	}
	for _, s := range h.Sensors {
		w, ok := want[s.Name]
		if !ok || s.Kind != w.kind || s.Value != w.value || s.Status != ipmi.SensorOK {
			t.Errorf("sensor %+v, want %+v ok", s, w)
		}
	}
	if h2, _, err := c.Health(ctx, tg, ipmi.HealthOptions{MaxSensors: 2}); err != nil || len(h2.Sensors) != 2 || h2.Dropped != 1 {
		t.Fatalf("capped at 2: %d sensors, %d dropped, %v", len(h2.Sensors), h2.Dropped, err)
	}
	if out, err := b.Emu("sensor_set_value 0x20 0 1 95 1"); err != nil {
		t.Fatalf("emu: %v: %s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	var cpu ipmi.SensorReading
	var h3 ipmi.Health
	for time.Now().Before(deadline) {
		h3, _, err = c.Health(ctx, tg, ipmi.HealthOptions{LogSeen: h.LogAddedAt})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range h3.Sensors {
			if s.Name == "CPU Temp" {
				cpu = s
			}
		}
		if cpu.Status == ipmi.SensorCritical {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if cpu.Status != ipmi.SensorCritical || cpu.Value != 95 {
		t.Fatalf("CPU Temp at 95 over 90: %+v", cpu)
	}
	critical := false
	for _, e := range h3.Log {
		critical = critical || e.Critical
	}
	t.Logf("after: CPU %+v; log read %v: %+v", cpu, h3.LogRead, h3.Log)
	if !critical {
		t.Errorf("no critical SEL entry after the threshold crossing: %+v", h3.Log)
	}
	h4, _, err := c.Health(ctx, tg, ipmi.HealthOptions{LogSeen: h3.LogAddedAt})
	if err != nil || h4.LogRead {
		t.Fatalf("an unchanged SEL was read again (%v)", err)
	}
	// An operator clears the event log (ipmitool, as they would): the
	// next poll reads it empty, so the critical entry is gone.
	require.Tool(t, "ipmitool")
	selClear := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(b.Port), "-U", b.User, "-E", "sel", "clear")
	selClear.Env = append(os.Environ(), "IPMI_PASSWORD="+b.Pass)
	if out, err := selClear.CombinedOutput(); err != nil {
		t.Fatalf("ipmitool sel clear: %v: %s", err, out)
	}
	var h5 ipmi.Health
	for deadline = time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if h5, _, err = c.Health(ctx, tg, ipmi.HealthOptions{LogSeen: h3.LogAddedAt}); err != nil {
			t.Fatal(err)
		}
		if h5.LogRead && len(h5.Log) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !h5.LogRead || len(h5.Log) != 0 {
		t.Fatalf("after sel clear: log read %v, %d entries, want an empty log read", h5.LogRead, len(h5.Log))
	}
}
