package web_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// TestBrowserHealth: a machine whose BMC is ipmi_sim with sensors shows,
// on its page, the BMC health card (status ok, the sensors) and its
// Console button; when a temperature crosses its critical threshold (and
// the BMC logs it) the open page turns critical, with the bmc-health
// condition and the event log's critical entry. The sensor's name is
// markup, and stays text.
func TestBrowserHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim and Chromium")
	}
	const hostile = `<img src=x>`
	sim := ipmisim.StartWithSensors(t, ipmisim.Options{}, []ipmisim.Sensor{
		{Number: 1, Name: hostile, Type: 0x01, Unit: 1, Raw: 45, UNC: 80, UCR: 90},
		{Number: 2, Name: "Fan 1", Type: 0x04, Unit: 18, M: 50, Raw: 120, UNC: 250, UCR: 254, LCR: 10},
	})
	a := startApplianceWith(t, appliance.BMCConfig{PollInterval: -1, HealthInterval: time.Second})
	if _, err := a.admin.EnrollMachine(context.Background(), &inventoryv1.EnrollMachineRequest{Name: "h1", BmcAddress: sim.Addr(),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: sim.User, BmcPassword: sim.Pass}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	b := startBrowser(t, a)
	b.signIn(a.tokens[authv1.Role_ROLE_OPERATOR], "h1", 30*time.Second)
	b.step("the machine's BMC health", 60*time.Second,
		chromedp.Navigate(a.base+"/#/machines/h1"),
		chromedp.WaitVisible(chromedp.CSS("#bmc-health table.sensors")),
		until(`document.getElementById('bmc-health-status').textContent === 'ok'`, 45*time.Second),
		chromedp.WaitVisible(chromedp.CSS("#console-open")),
	)
	if out, err := sim.Emu("sensor_set_value 0x20 0 1 95 1"); err != nil {
		t.Fatalf("emu: %v: %s", err, out)
	}
	// The poll is every second; the bound is for a loaded machine (the
	// whole package under -race beside QEMU once took more than 45 s).
	// The record first, so a failure says whether the appliance or the
	// page is behind.
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m, err := a.admin.GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: "h1"})
		if err == nil && m.GetBmc().GetHealth().GetStatus() == "critical" && m.GetBmc().GetHealth().GetLogCriticalId() != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record's BMC health 120 s after the temperature crossed its threshold: %v (%v)", m.GetBmc().GetHealth(), err)
		}
	}
	b.step("the temperature past its threshold", 150*time.Second,
		until(`document.getElementById('bmc-health-status').textContent === 'critical'`, 120*time.Second),
		until(`document.getElementById('bmc-health').textContent.includes('critical entry #')`, 20*time.Second),
	)
	card := eval[string](b, `document.getElementById('bmc-health').textContent`)
	for _, want := range []string{hostile, "Fan 1", "critical", "bmc-health", "ucr"} {
		if !strings.Contains(card, want) {
			t.Errorf("the BMC health card lacks %q:\n%s", want, card)
		}
	}
	if n := eval[int](b, `document.querySelectorAll('#bmc-health img, main img').length`); n != 0 {
		t.Errorf("a sensor's name became markup: %d img elements", n)
	}
	if row := eval[string](b, `(() => { const r = document.querySelector('#bmc-health tr.sensor-critical'); return r ? r.firstChild.textContent : ''; })()`); row != hostile {
		t.Errorf("the critical sensor's row names %q, want %q", row, hostile)
	}
	shot(b.ctx, t, "bmc-health")
	checkCSP(b.ctx, t)
}
