package ipmi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestRedfishAccounts: on the Redfish test server's AccountService, an
// account is made in a free slot, logs in, is found again by its name
// (a second set after a crash changes its password in the same slot), and
// once disabled its password is refused; the account logged in with is
// never touched.
func TestRedfishAccounts(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	admin := redfishTarget(rf)
	as := func(user, pw string) ipmi.Target { tg := admin; tg.Username, tg.Password = user, pw; return tg }
	pw1 := ipmi.NewPassword()
	id, a, err := c.SetAccount(ctx, admin, ipmi.Account{Name: "corral-a", Password: pw1})
	if err != nil || a.Provider != ipmi.RedfishProviderName {
		t.Fatalf("set: %v (%s)", err, a)
	}
	if id < 2 {
		t.Fatalf("account in slot %d", id)
	}
	if _, _, err := c.PowerState(ctx, as("corral-a", pw1)); err != nil {
		t.Fatalf("the new account: %v", err)
	}
	// Set again (an appliance that died after the BMC took the first
	// password runs the step again): same slot, new password.
	pw2 := ipmi.NewPassword()
	id2, _, err := c.SetAccount(ctx, admin, ipmi.Account{Name: "corral-a", Password: pw2})
	if err != nil || id2 != id {
		t.Fatalf("set again: slot %d (was %d): %v", id2, id, err)
	}
	if _, _, err := c.PowerState(ctx, as("corral-a", pw1)); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("the replaced password: want ErrAuth, got %v", err)
	}
	// The other account, made with corral-a's credential.
	pwB := ipmi.NewPassword()
	idB, _, err := c.SetAccount(ctx, as("corral-a", pw2), ipmi.Account{Name: "corral-b", Password: pwB})
	if err != nil || idB == id {
		t.Fatalf("corral-b: slot %d: %v", idB, err)
	}
	if _, err := c.DisableAccount(ctx, as("corral-b", pwB), id); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if _, _, err := c.PowerState(ctx, as("corral-a", pw2)); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("the disabled account: want ErrAuth, got %v", err)
	}
	if _, _, err := c.PowerState(ctx, as("corral-b", pwB)); err != nil {
		t.Fatalf("corral-b: %v", err)
	}
	if !rf.LogsIn("root", "calvin") {
		t.Fatal("the enrolment account was touched")
	}
	// Refusals: the account logged in with, or a slot that is not there.
	if _, err := c.DisableAccount(ctx, as("corral-b", pwB), idB); !errors.Is(err, ipmi.ErrInvalid) {
		t.Fatalf("disabling the account in use: want ErrInvalid, got %v", err)
	}
	if _, err := c.DisableAccount(ctx, admin, 99); !errors.Is(err, ipmi.ErrFailed) {
		t.Fatalf("disabling a missing slot: want ErrFailed, got %v", err)
	}
	// A full BMC: every slot taken.
	for i := 0; ; i++ {
		_, _, err := c.SetAccount(ctx, admin, ipmi.Account{Name: "filler" + string(rune('a'+i)), Password: ipmi.NewPassword()})
		if err != nil {
			if !errors.Is(err, ipmi.ErrFailed) || !strings.Contains(err.Error(), "no free account slot") {
				t.Fatalf("a full BMC: %v", err)
			}
			break
		}
		if i > redfishtest.AccountSlots {
			t.Fatal("more accounts than slots")
		}
	}
	for _, acc := range rf.Accounts() {
		if acc.UserName == "corral-a" && (acc.Enabled || acc.Password == pw2) {
			t.Fatalf("the disabled account %+v", acc)
		}
	}
}

// TestRedfishHealth: Thermal, Power and the SEL read into sensors and log
// entries; a fan under its threshold, a temperature whose Status.Health
// is Critical and a Critical log entry are critical.
func TestRedfishHealth(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	tg := redfishTarget(rf)
	h, a, err := c.Health(ctx, tg, ipmi.HealthOptions{})
	if err != nil || a.Provider != ipmi.RedfishProviderName {
		t.Fatalf("health: %v (%s)", err, a)
	}
	kinds := map[string]int{}
	for _, s := range h.Sensors {
		kinds[s.Kind]++
		if s.Status != ipmi.SensorOK {
			t.Errorf("healthy machine: %+v", s)
		}
		if s.Kind == "power" && s.Value != 180 {
			t.Errorf("power drawn %v, want 180", s.Value)
		}
	}
	if kinds["temperature"] != 2 || kinds["fan"] != 2 || kinds["power"] != 1 || kinds["power-supply"] != 1 {
		t.Fatalf("sensors by kind %v", kinds)
	}
	if !h.LogRead || len(h.Log) != 0 {
		t.Fatalf("log %+v", h.Log)
	}

	sick := redfishtest.DefaultHealth()
	sick.Fans[1].Reading = 500                // under LowerThresholdCritical 1000
	sick.Temperatures[1].ReadingCelsius = 41  // over UpperThresholdNonCritical 40
	sick.PowerSupplies[0].Health = "Critical" // the BMC says so
	sick.Fans[0].UpperThresholdCritical = 0   // no threshold published
	sick.SEL = []redfishtest.LogEntry{
		{ID: 1, Created: "2026-11-29T08:00:00Z", Severity: "OK", Message: "System boot"},
		{ID: 2, Created: "2026-11-29T08:05:00Z", Severity: "Critical", Message: "Memory uncorrectable ECC, DIMM A1"},
	}
	rf.SetHealth(sick)
	h, _, err = c.Health(ctx, tg, ipmi.HealthOptions{MaxSensors: 5})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]ipmi.SensorReading{}
	for _, s := range h.Sensors {
		by[s.Name] = s
	}
	if s := by["Fan2"]; s.Status != ipmi.SensorCritical || s.Threshold != "lcr" || s.Value != 500 || s.Unit != "RPM" {
		t.Errorf("fan under its threshold: %+v", s)
	}
	if s := by["Inlet Temp"]; s.Status != ipmi.SensorWarning || s.Threshold != "unc" {
		t.Errorf("temperature over its non-critical threshold: %+v", s)
	}
	if s := by["Fan1"]; s.Status != ipmi.SensorOK {
		t.Errorf("Fan1: %+v", s)
	}
	if len(h.Sensors) != 5 || h.Dropped != 1 {
		t.Errorf("MaxSensors 5: %d sensors, %d dropped", len(h.Sensors), h.Dropped)
	}
	if len(h.Log) != 2 || h.Log[0].Critical || !h.Log[1].Critical || h.Log[1].ID != 2 || !strings.Contains(h.Log[1].Text, "ECC") ||
		h.LogAddedAt.Format("15:04") != "08:05" {
		t.Fatalf("log %+v (added %v)", h.Log, h.LogAddedAt)
	}
	h, _, err = c.Health(ctx, tg, ipmi.HealthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range h.Sensors {
		if s.Name == "PSU1" && (s.Status != ipmi.SensorCritical || s.Threshold != "health") {
			t.Errorf("a power supply whose Status.Health is Critical: %+v", s)
		}
	}
	// A long log whose collection lists links only: the newest 64
	// entries are read, not every one.
	long := redfishtest.DefaultHealth()
	long.SELLinksOnly = true
	for i := 1; i <= 300; i++ {
		e := redfishtest.LogEntry{ID: i, Created: time.Date(2026, 11, 29, 0, 0, i, 0, time.UTC).Format(time.RFC3339), Severity: "OK", Message: "entry"}
		if i == 290 {
			e.Severity, e.Message = "Critical", "CPU2 thermal trip"
		}
		long.SEL = append(long.SEL, e)
	}
	rf.SetHealth(long)
	before := len(rf.Requests())
	h, _, err = c.Health(ctx, tg, ipmi.HealthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	entryGETs := 0
	for _, r := range rf.Requests()[before:] {
		if strings.HasPrefix(r, "GET /redfish/v1/Managers/1/LogServices/SEL/Entries/") {
			entryGETs++
		}
	}
	critical := 0
	for _, e := range h.Log {
		if e.Critical {
			critical = int(e.ID)
		}
	}
	if len(h.Log) != 64 || h.Log[63].ID != 300 || critical != 290 || entryGETs != 64 {
		t.Fatalf("a 300-entry log: %d entries read (%d GETs of an entry), last %d, critical %d", len(h.Log), entryGETs, h.Log[len(h.Log)-1].ID, critical)
	}
	// A wrong password is refused as with power.
	bad := tg
	bad.Password = "wrong-password"
	if _, _, err := c.Health(ctx, bad, ipmi.HealthOptions{}); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("wrong password: want ErrAuth, got %v", err)
	}
}
