package appliance

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// healthSensors are a small server's sensors: a CPU temperature, a fan
// (50 RPM a count) and the power draw (4 W a count).
var healthSensors = []ipmisim.Sensor{
	{Number: 1, Name: "CPU Temp", Type: 0x01, Unit: 1, Raw: 45, UNC: 80, UCR: 90},
	{Number: 2, Name: "Fan 1", Type: 0x04, Unit: 18, M: 50, Raw: 120, UNC: 250, UCR: 254, LCR: 10},
	{Number: 3, Name: "Power Draw", Type: 0x08, Unit: 6, M: 4, Raw: 50, UNC: 200, UCR: 230},
}

type healthRig struct {
	sim    *ipmisim.BMC
	inv    *inventory.Inventory
	bc     *bmc.Service
	writes atomic.Int64
	reads  atomic.Int64
}

func newHealthRig(t testing.TB, sensors []ipmisim.Sensor) *healthRig {
	r := &healthRig{sim: ipmisim.StartWithSensors(t, ipmisim.Options{}, sensors)}
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	r.inv = inv
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	sealer, err := seal.Ensure(filepath.Join(t.TempDir(), seal.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ad := bmcAdapter{c: ipmi.New(ipmi.Config{Providers: []string{ipmi.NativeProviderName}})}
	r.bc, err = bmc.New(bmc.Config{Machines: inv, Events: inv, Store: st, Driver: ad, Health: ad, Sealer: sealer,
		OnHealth: func(string, bmc.Health) { r.reads.Add(1) }, OnHealthWrite: func() { r.writes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.bc.Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: "h1", BmcAddress: r.sim.Addr(), BootMac: "52:54:00:00:00:81",
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: r.sim.User, BmcPassword: r.sim.Pass}); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestBMCHealthSim: the health poll on ipmi_sim's SDR records the
// sensors once and then writes nothing while nothing changes; a sensor
// set past its critical threshold sets the bmc-health flag (the
// machine's condition) with a timeline entry, and the critical SEL entry
// it logged keeps it.
func TestBMCHealthSim(t *testing.T) {
	t.Parallel()
	r := newHealthRig(t, healthSensors)
	ctx := context.Background()
	for range 3 {
		if err := r.bc.RefreshHealth(ctx, "h1"); err != nil {
			t.Fatal(err)
		}
	}
	if w := r.writes.Load(); w != 1 {
		t.Fatalf("3 polls of an unchanged BMC wrote %d times, want 1", w)
	}
	m, err := r.inv.GetMachine(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	h := m.GetBmc().GetHealth()
	if h.GetStatus() != "ok" || len(h.GetSensors()) != 3 || hasFlagPrefix(m, bmc.FlagHealth) {
		t.Fatalf("health %v, flags %q", h, m.GetFlags())
	}
	if out, err := r.sim.Emu("sensor_set_value 0x20 0 1 95 1"); err != nil {
		t.Fatalf("emu: %v: %s", err, out)
	}
	if err := r.bc.RefreshHealth(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	m, _ = r.inv.GetMachine(ctx, "h1")
	flag := ""
	for _, f := range m.GetFlags() {
		if strings.HasPrefix(f, bmc.FlagHealth) {
			flag = f
		}
	}
	t.Logf("flag: %s", flag)
	if !strings.Contains(flag, "critical") || !strings.Contains(flag, "CPU Temp 95") || !strings.Contains(flag, "event log entry") {
		t.Fatalf("flag after CPU Temp 95 over 90: %q (health %v)", flag, m.GetBmc().GetHealth())
	}
	// The timeline is written behind the call.
	found := false
	for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		tl, err := r.inv.Timeline(ctx, "h1", "", 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range tl {
			found = found || e.GetEvent() == bmc.FlagHealth
		}
	}
	if !found {
		t.Fatalf("no %s timeline entry", bmc.FlagHealth)
	}
	// Back under the threshold: the sensor is ok, the logged critical
	// event keeps the machine flagged.
	if _, err := r.sim.Emu("sensor_set_value 0x20 0 1 45 1"); err != nil {
		t.Fatal(err)
	}
	if err := r.bc.RefreshHealth(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	m, _ = r.inv.GetMachine(ctx, "h1")
	if h := m.GetBmc().GetHealth(); h.GetStatus() != "critical" || h.GetLogCriticalId() == 0 || !hasFlagPrefix(m, bmc.FlagHealth) {
		t.Fatalf("after the sensor came back: health %v, flags %q", h, m.GetFlags())
	}
}

func hasFlagPrefix(m *inventoryv1.Machine, p string) bool {
	for _, f := range m.GetFlags() {
		if strings.HasPrefix(f, p) {
			return true
		}
	}
	return false
}

// BenchmarkBMCHealthPoll (cpuTime: storm_bench_test.go) prints what one machine's health poll costs the
// appliance (CPU time of the process, ipmi_sim excluded; store writes per
// poll) against ipmi_sim with 3 and with 24 sensors, nothing changing:
// the figure to multiply by the machines an appliance polls.
func BenchmarkBMCHealthPoll(b *testing.B) {
	for _, n := range []int{3, 24} {
		b.Run(fmt.Sprintf("sensors=%d", n), func(b *testing.B) {
			var sensors []ipmisim.Sensor
			for i := range n {
				s := healthSensors[i%3]
				s.Number, s.Name = uint8(i+1), fmt.Sprintf("%s %d", strings.Fields(s.Name)[0], i+1)
				sensors = append(sensors, s)
			}
			r := newHealthRig(b, sensors)
			ctx := context.Background()
			if err := r.bc.RefreshHealth(ctx, "h1"); err != nil {
				b.Fatal(err)
			}
			r.writes.Store(0)
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				if err := r.bc.RefreshHealth(ctx, "h1"); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/poll")
			b.ReportMetric(float64(r.writes.Load())/float64(b.N), "writes/poll")
			b.Logf("%d sensors: %v CPU per poll, %.2f store writes per poll (%d polls); at 5,000 machines every 5 min: %.1f%% of a core",
				n, cpu/time.Duration(b.N), float64(r.writes.Load())/float64(b.N), b.N, 100*float64(cpu/time.Duration(b.N))*5000/float64(5*time.Minute))
		})
	}
}
