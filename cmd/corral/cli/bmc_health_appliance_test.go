package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// TestBMCHealthThroughCorrald: corrald's health poller reads ipmi_sim's
// sensors; describe machine shows them, and a sensor set past its
// critical threshold shows as the bmc-health flag and on the timeline.
func TestBMCHealthThroughCorrald(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim")
	}
	b := ipmisim.StartWithSensors(t, ipmisim.Options{}, []ipmisim.Sensor{
		{Number: 1, Name: "CPU Temp", Type: 0x01, Unit: 1, Raw: 45, UNC: 80, UCR: 90},
		{Number: 2, Name: "Fan 1", Type: 0x04, Unit: 18, M: 50, Raw: 120, UNC: 250, UCR: 254, LCR: 10},
	})
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1, HealthInterval: 300 * time.Millisecond}})
	pw := writePassword(t, b.Pass, 0o600)
	app.ok(t, "machine", "enroll", "m1", "--bmc", b.Addr(), "--bmc-protocol", "ipmi", "--bmc-user", b.User, "--bmc-password-file", pw, "--mac", "52:54:00:00:00:73")
	eventually(t, 20*time.Second, "describe shows the sensors", func() bool {
		d := app.ok(t, "describe", "machine", "m1")
		return strings.Contains(d, "name: CPU Temp") && strings.Contains(d, "kind: fan")
	})
	if _, err := b.Emu("sensor_set_value 0x20 0 1 95 1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the bmc-health flag", func() bool {
		return strings.Contains(app.ok(t, "describe", "machine", "m1"), "bmc-health: critical: CPU Temp 95")
	})
	eventually(t, 10*time.Second, "the timeline entry", func() bool {
		return strings.Contains(app.ok(t, "machine", "timeline", "m1"), "bmc-health")
	})
}
