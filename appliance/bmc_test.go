package appliance

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/ipmi/poller"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBMCPoll50 polls 50 ipmi_sim BMCs on loopback concurrently: no
// failures, every state recorded.
func TestBMCPoll50(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 50 ipmi_sim")
	}
	require.Tool(t, "ipmi_sim")
	p, inv := setup50(t, nil)
	round := p.Poll(context.Background())
	if round.Machines != 50 || round.Failed != 0 {
		t.Fatalf("round: %+v", round)
	}
	ms, err := inv.ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	on := 0
	for _, m := range ms {
		if m.GetPowerState() == inventoryv1.PowerState_POWER_STATE_ON {
			on++
		}
	}
	if on != 25 {
		t.Errorf("%d machines read on, want 25", on)
	}
	t.Logf("polled 50 BMCs in %s", round.Took)
}

// BenchmarkBMCPoll50 prints the wall time of one poll round over 50
// ipmi_sim BMCs (concurrency 16), native provider vs bmclib's ipmitool
// provider.
func BenchmarkBMCPoll50(b *testing.B) {
	require.Tool(b, "ipmi_sim")
	for _, prov := range []string{ipmi.NativeProviderName, ipmi.IpmitoolProviderName} {
		b.Run(prov, func(b *testing.B) {
			if prov == ipmi.IpmitoolProviderName {
				require.Tool(b, "ipmitool")
			}
			p, _ := setup50(b, []string{prov})
			b.ResetTimer()
			for b.Loop() {
				if r := p.Poll(context.Background()); r.Failed != 0 {
					b.Fatalf("round: %+v", r)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/round")
		})
	}
}

// setup50 starts 50 ipmi_sim BMCs, enrolls them (half powered on behind
// corrald's back) and returns a poller over them.
func setup50(t testing.TB, providers []string) (*poller.Poller, *inventory.Inventory) {
	const n = 50
	bmcs := make([]*ipmisim.BMC, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bmcs[i] = ipmisim.Start(t, ipmisim.Options{})
		}()
	}
	wg.Wait()
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	sealer, err := seal.Ensure(filepath.Join(t.TempDir(), seal.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	bc, err := bmc.New(bmc.Config{Machines: inv, Events: inv, Store: st, Driver: bmcAdapter{c: ipmi.New(ipmi.Config{Providers: providers})}, Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bmcs {
		if _, err := bc.Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: fmt.Sprintf("p%02d", i), BmcAddress: b.Addr(),
			BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: b.User, BmcPassword: b.Pass}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 2 {
		if err := bmcs[i].Machine().Reset("On"); err != nil {
			t.Fatal(err)
		}
	}
	p, err := poller.New(poller.Config{Source: bc, Concurrency: 16, Interval: time.Second, Jitter: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	return p, inv
}

// TestBMCAdapterTLS: inventory's certificate policy reaches ipmi as the
// matching TLS mode (nothing given stays "pinned, nothing pinned", which
// ipmi refuses), and ipmi's certificate refusal comes back as inventory's
// error with the operator's way out.
func TestBMCAdapterTLS(t *testing.T) {
	if bmc.RedfishProviderName != ipmi.RedfishProviderName {
		t.Fatalf("bmc.RedfishProviderName %q != ipmi.RedfishProviderName %q", bmc.RedfishProviderName, ipmi.RedfishProviderName)
	}
	pin := strings.Repeat("cd", 32)
	for name, tc := range map[string]struct {
		in   bmc.Target
		mode ipmi.TLSMode
		pin  string
	}{
		"pinned":    {bmc.Target{TLSSHA256: pin}, ipmi.TLSPinned, pin},
		"first use": {bmc.Target{TLSFirstUse: true}, ipmi.TLSFirstUse, ""},
		"insecure":  {bmc.Target{TLSInsecure: true}, ipmi.TLSInsecure, ""},
		"nothing":   {bmc.Target{}, ipmi.TLSPinned, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got := toTarget(tc.in)
			if got.TLSMode != tc.mode || got.TLSSHA256 != tc.pin {
				t.Fatalf("got %s %q, want %s %q", got.TLSMode, got.TLSSHA256, tc.mode, tc.pin)
			}
		})
	}
	other := strings.Repeat("ef", 32)
	err := toInventoryErr(fmt.Errorf("redfish://10.0.0.1:443: %w", &ipmi.CertificateError{Pinned: pin, Presented: other}))
	var ce *bmc.CertificateError
	if !errors.As(err, &ce) || ce.Pinned != pin || ce.Presented != other || !errors.Is(err, apierr.ErrPrecondition) ||
		!strings.Contains(err.Error(), "re-enroll with --bmc-tls-sha256 "+other+" if this is expected") {
		t.Fatalf("certificate error: %v", err)
	}
	if st := apierr.ToStatus(err); status.Code(st) != codes.FailedPrecondition {
		t.Fatalf("status %v", st)
	}
}
