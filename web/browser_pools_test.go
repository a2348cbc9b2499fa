package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/inventory"
)

// poolRig puts two machines of pool ci on a in READY, applies the
// powered-off standby pool ci (min_ready 1, selector "cpu.cores>=1") and
// allocates one of them; it returns the free one and the allocated one.
func poolRig(t *testing.T, a *applianceRig) (free, taken string) {
	t.Helper()
	ctx := context.Background()
	names := []string{a.machine(t, "SN-POOL-1", "52:54:00:cc:00:01"), a.machine(t, "SN-POOL-2", "52:54:00:cc:00:02")}
	for _, n := range names {
		if _, err := a.admin.LabelMachine(ctx, &inventoryv1.LabelMachineRequest{Name: n, Set: map[string]string{"pool": "ci"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.srv.Inventory().AcceptToPool(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.srv.StandbyPools().Apply(ctx, &inventoryv1.StandbyPool{Name: "ci", Selector: "cpu.cores>=1", MinReady: 1,
		Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF}); err != nil {
		t.Fatal(err)
	}
	ms, err := a.srv.Inventory().AllocateMachines(ctx, inventory.Owner{ID: "token:web-test", Name: "web test", Operator: true}, inventory.AllocateRequest{Pool: "ci"})
	if err != nil || len(ms) != 1 {
		t.Fatalf("allocate from ci: %v (%d machines)", err, len(ms))
	}
	taken = ms[0].GetName()
	free = names[0]
	if free == taken {
		free = names[1]
	}
	return free, taken
}

// TestRESTStandbyPools: GET /v1/standby-pools, which the Pools page polls,
// answers a page of pools with their status for a viewer (lowerCamel
// fields), and refuses a garbled page token.
func TestRESTStandbyPools(t *testing.T) {
	a := startAppliance(t)
	free, _ := poolRig(t, a)
	viewer := a.tokens[authv1.Role_ROLE_VIEWER]
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, body := a.do(t, "GET", "/v1/standby-pools", viewer, "", "")
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/standby-pools = %d %s", res.StatusCode, body)
		}
		var got struct {
			Pools []struct {
				Name   string
				Status struct {
					Ready, Allocated int
					ReadyMachines    []string `json:"readyMachines"`
				}
			}
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		if len(got.Pools) == 1 && got.Pools[0].Name == "ci" && got.Pools[0].Status.Ready == 1 && got.Pools[0].Status.Allocated == 1 &&
			slices.Equal(got.Pools[0].Status.ReadyMachines, []string{free}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool's status never counted the allocation: %s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if res, body := a.do(t, "GET", "/v1/standby-pools?pageToken=x", viewer, "", ""); res.StatusCode != http.StatusBadRequest {
		t.Errorf("a garbled pageToken = %d %s, want 400", res.StatusCode, body)
	}
	if res, _ := a.do(t, "GET", "/v1/standby-pools", "", "", ""); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token = %d, want 401", res.StatusCode)
	}
}

// TestBrowserPools: in Chromium, the Pools page shows the standby pool's
// selector, min_ready, mode and counts as the controller wrote them, and
// a row for each of its machines with the state the machine watch keeps
// live (a change made over gRPC shows without a reload). No
// Content-Security-Policy violation may occur.
func TestBrowserPools(t *testing.T) {
	a := startAppliance(t)
	free, taken := poolRig(t, a)
	b := startBrowser(t, a)
	b.signIn(a.tokens[authv1.Role_ROLE_VIEWER], free, 30*time.Second)
	figure := func(name string) string {
		return fmt.Sprintf(`(document.querySelector('section[data-pool=ci] dd[data-figure=%s]') || {}).textContent`, name)
	}
	row := func(machine string) string {
		return fmt.Sprintf(`(document.querySelector('section[data-pool=ci] tr[data-name=%q] td.state') || {}).textContent`, machine)
	}
	b.step("pools page", 40*time.Second,
		chromedp.Click(chromedp.CSS(`#nav a[data-page=pools]`)),
		chromedp.WaitVisible(chromedp.CSS(`section[data-pool=ci]`)),
		until(figure("allocated")+` === '1'`, 30*time.Second),
		until(row(free)+` === 'READY'`, 30*time.Second),
	)
	// A viewer does not see the machine someone else holds: it is counted,
	// not named.
	if got := eval[bool](b, fmt.Sprintf(`document.querySelector('section[data-pool=ci] tr[data-name=%q]') === null`, taken)); !got {
		t.Errorf("a viewer sees the row of %s, allocated to someone else", taken)
	}
	for fig, want := range map[string]string{"selector": "pool=ci,cpu.cores>=1", "min-ready": "1", "mode": "powered off", "ready": "1", "deficit": "0", "warming": "—"} {
		if got := eval[string](b, figure(fig)); got != want {
			t.Errorf("pool ci %s: %q, want %q", fig, got, want)
		}
	}
	if got := eval[string](b, `document.getElementById('pool-count').textContent`); got != "1 pool" {
		t.Errorf("pool count %q", got)
	}
	if got := eval[string](b, `document.querySelector('#nav a.active').dataset.page`); got != "pools" {
		t.Errorf("active navigation %q, want pools", got)
	}
	shot(b.ctx, t, "pools")

	// The free machine goes into maintenance elsewhere: without a reload,
	// the pool falls short and lists no machine.
	if _, err := a.admin.SetMaintenance(context.Background(), &inventoryv1.SetMaintenanceRequest{Name: free, On: true, Reason: "pools test"}); err != nil {
		t.Fatal(err)
	}
	b.step("the pool falls short", 40*time.Second,
		until(figure("deficit")+` === '1'`, 30*time.Second),
		until(figure("ready")+` === '0'`, 30*time.Second),
		until(`document.querySelector('section[data-pool=ci] h2 .badge').textContent === 'short 1'`, 30*time.Second),
		until(fmt.Sprintf(`document.querySelector('section[data-pool=ci] tr[data-name=%q]') === null`, free), 30*time.Second),
		until(`document.querySelector('section[data-pool=ci] tr.empty').textContent.includes('held by other owners')`, 30*time.Second),
	)
	if kept := eval[bool](b, `window.notReloaded === true`); !kept {
		t.Error("the page reloaded to show the change")
	}
	shot(b.ctx, t, "pools-short")
	checkCSP(b.ctx, t)

	// An operator sees the allocated machine, its state and its owner.
	b.step("sign out", 10*time.Second, chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.signIn(a.tokens[authv1.Role_ROLE_OPERATOR], taken, 30*time.Second)
	b.step("operator's pools page", 40*time.Second,
		chromedp.Click(chromedp.CSS(`#nav a[data-page=pools]`)),
		until(row(taken)+` === 'ALLOCATED'`, 30*time.Second),
	)
	if got := eval[string](b, fmt.Sprintf(`document.querySelector('section[data-pool=ci] tr[data-name=%q]').textContent`, taken)); !strings.Contains(got, "token:web-test (web test)") {
		t.Errorf("the operator's row of %s: %q, want its owner", taken, got)
	}
	shot(b.ctx, t, "pools-operator")
	checkCSP(b.ctx, t)
}
