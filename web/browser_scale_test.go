package web_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"google.golang.org/protobuf/proto"
)

// scaleMachines is how many machines TestBrowserScale puts in the rack.
const scaleMachines = 5000

// TestBrowserScale opens the machines page of a rack of 5,000 machines in
// Chromium and prints how long the first render took and how long a live
// update (one machine's state changed over gRPC) took to show in its row.
// It prints figures; it asserts only that the page gets there.
func TestBrowserScale(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 machines in Chromium: not with -short")
	}
	a := startAppliance(t)
	names := a.manyMachines(t, scaleMachines)
	operator := a.tokens[authv1.Role_ROLE_OPERATOR]

	// One page of the list (what the page polls without Watch, and what
	// the CLI reads), for the record: the largest page of summaries.
	if res, err := a.admin.ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}); err != nil {
		t.Logf("ListMachines with %d machines (a page of 1,000 summaries): %v", scaleMachines, err)
	} else {
		t.Logf("ListMachines with %d machines: a page of %d summaries is one %d-byte message (small facts)", scaleMachines, len(res.GetMachines()), proto.Size(res))
	}

	b := startBrowser(t, a)
	t0 := time.Now()
	// The sign-in waits for the first machine's row (names sort as
	// stored); the page notes when its table was first complete.
	b.signIn(operator, names[0], 3*time.Minute)
	b.step("table", 3*time.Minute, until(`!!(window.corralPerf && window.corralPerf.initialRender)`, 3*time.Minute))
	seen := time.Since(t0)
	initial := eval[map[string]float64](b, `window.corralPerf.initialRender`)
	t.Logf("initial render of %d machines (%d rows listed): %.0f ms from opening the machines page to the complete table by the page's performance.now() (%.0f ms until the watch's SYNCED, %.0f ms building the table to its first frame, of which %.0f ms script); %d ms from pressing Sign in to the test seeing it",
		int(initial["rows"]), int(initial["shown"]), initial["ms"], initial["dataMs"], initial["buildMs"], initial["jsMs"], seen.Milliseconds())
	if cuts := eval[map[string]any](b, `({ n: window.corralPerf.streamErrors || 0, last: window.corralPerf.lastStreamError || '' })`); cuts["n"] != float64(0) {
		t.Logf("the watch stream ended with a status %v times before the table was complete (last: %v); the page listed again", cuts["n"], cuts["last"])
	}
	if c := eval[string](b, `document.getElementById('machine-count').textContent`); c != "5,000 machines" {
		t.Errorf("the count says %q", c)
	}
	shot(b.ctx, t, "scale-initial")

	// Live updates: one listed machine at a time changes state through
	// the API; the page stamps (wall clock) when the row's change reaches
	// a frame.
	listed := eval[[]string](b, visibleRows)
	var lat []int64
	for i, name := range []string{listed[len(listed)/2], listed[1], listed[len(listed)-2], listed[len(listed)/3], listed[2*len(listed)/3]} {
		start := time.Now()
		if _, err := a.admin.SetMaintenance(context.Background(), &inventoryv1.SetMaintenanceRequest{Name: name, On: true, Reason: "scale test"}); err != nil {
			t.Fatal(err)
		}
		b.step("live update "+name, time.Minute, until(fmt.Sprintf(`((window.corralPerf.updates[%q] || {}).state === 'MAINTENANCE') && document.querySelector('tr[data-name=%q] td.state').textContent === 'MAINTENANCE'`, name, name), time.Minute))
		at := eval[float64](b, fmt.Sprintf(`window.corralPerf.updates[%q].at`, name))
		ms := int64(at) - start.UnixMilli()
		lat = append(lat, ms)
		t.Logf("live update %d (%s to MAINTENANCE): %d ms from the SetMaintenance call to the row showing it", i+1, name, ms)
	}
	slices.Sort(lat)
	t.Logf("live update with %d machines: median %d ms, max %d ms (of %d updates)", scaleMachines, lat[len(lat)/2], lat[len(lat)-1], len(lat))

	// Filter and sort, timed by the page's clock (synchronous handlers,
	// forced layout).
	filter := eval[float64](b, `(() => { const t = performance.now(); const e = document.getElementById('machine-state'); e.value = 'MAINTENANCE'; e.dispatchEvent(new Event('change')); document.body.offsetHeight; return performance.now() - t; })()`)
	shown := eval[int](b, `[...document.querySelectorAll('table.machines tbody tr')].filter((r) => !r.hidden).length`)
	shot(b.ctx, t, "scale-filtered")
	unfilter := eval[float64](b, `(() => { const t = performance.now(); const e = document.getElementById('machine-state'); e.value = ''; e.dispatchEvent(new Event('change')); document.body.offsetHeight; return performance.now() - t; })()`)
	sort := eval[float64](b, `(() => { const t = performance.now(); document.querySelector('th[data-sort=serial] button').click(); document.body.offsetHeight; return performance.now() - t; })()`)
	more := eval[float64](b, `(() => { const t = performance.now(); document.getElementById('machine-more').click(); document.body.offsetHeight; return performance.now() - t; })()`)
	rows := eval[int](b, `document.querySelectorAll('table.machines tbody tr').length`)
	t.Logf("filter to MAINTENANCE (%d rows shown): %.0f ms; back to all: %.0f ms; sort by serial: %.0f ms; list more (%d rows): %.0f ms", shown, filter, unfilter, sort, rows, more)
	if shown != len(lat) {
		t.Errorf("the MAINTENANCE filter shows %d rows, want %d", shown, len(lat))
	}
	checkCSP(b.ctx, t)
}

// manyMachines stores n inventoried machines with small facts straight
// into the appliance's inventory (no boots, no timeline), a few at a time
// so the store's commits are shared, and returns their names in order.
func (a *applianceRig) manyMachines(t *testing.T, n int) []string {
	t.Helper()
	start := time.Now()
	names := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				mac := fmt.Sprintf("52:54:01:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff)
				serial := fmt.Sprintf("SN-SCALE-%05d", i)
				m, err := a.srv.Inventory().CreateMachine(context.Background(), &inventoryv1.Machine{
					Name: inventory.MachineNameForMAC(mac), Serial: serial, BootMac: mac, Macs: []string{mac},
					State: inventoryv1.Machine_INVENTORIED, Facts: machinefacts.QEMU(serial, "", mac),
				})
				if err != nil {
					select {
					case errs <- fmt.Errorf("machine %d: %w", i, err):
					default:
					}
					return
				}
				names[i] = m.GetName()
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("stored %d machines in %v", n, time.Since(start).Round(time.Millisecond))
	return names
}
