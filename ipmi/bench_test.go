package ipmi_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/require"
)

// BenchmarkProviders prints per-operation p50/p99 of the native go-ipmi
// provider and bmclib's ipmitool provider against ipmi_sim. Each operation
// is what corrald does for one API call: open a session, run, close.
// Run: go test -run '^$' -bench Providers -benchtime 50x ./ipmi/
func BenchmarkProviders(b *testing.B) {
	require.Tool(b, "ipmi_sim")
	bmc := ipmisim.Start(b, ipmisim.Options{})
	power := func(a ipmi.PowerAction) func(c *ipmi.Controller, t ipmi.Target) error {
		return func(c *ipmi.Controller, t ipmi.Target) error {
			_, err := c.SetPower(context.Background(), t, a)
			return err
		}
	}
	ops := []struct {
		name string
		prep func(c *ipmi.Controller, t ipmi.Target) error // untimed, so each timed op changes state
		do   func(c *ipmi.Controller, t ipmi.Target) error
	}{
		{"status", nil, func(c *ipmi.Controller, t ipmi.Target) error {
			_, _, err := c.PowerState(context.Background(), t)
			return err
		}},
		{"on", power(ipmi.ActionOff), power(ipmi.ActionOn)},
		{"off", power(ipmi.ActionOn), power(ipmi.ActionOff)},
		{"bootdev", nil, func(c *ipmi.Controller, t ipmi.Target) error {
			_, err := c.SetBootDevice(context.Background(), t, ipmi.BootPXE, ipmi.BootOptions{})
			return err
		}},
	}
	for _, prov := range []string{ipmi.NativeProviderName, ipmi.IpmitoolProviderName} {
		for _, op := range ops {
			b.Run(prov+"/"+op.name, func(b *testing.B) {
				if prov == ipmi.IpmitoolProviderName {
					require.Tool(b, "ipmitool")
				}
				c := ipmi.New(ipmi.Config{Providers: []string{prov}})
				t := simTarget(bmc)
				t.CipherSuite = 3 // ipmi_sim offers 0-3; both providers use 3
				var lat []time.Duration
				for b.Loop() {
					if op.prep != nil {
						b.StopTimer()
						if err := op.prep(c, t); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
					start := time.Now()
					if err := op.do(c, t); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				slices.Sort(lat)
				p50, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
				fmt.Printf("%-12s %-8s n=%-4d p50=%-10s p99=%s\n", prov, op.name, len(lat), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
			})
		}
	}
}
