package inventory

import (
	"errors"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// TestCommissionBounds: what an agent reports is cut to its bounds as
// valid UTF-8, a kind the plan lacks or an unknown result is a failure,
// and no more than MaxCommissionTests are kept.
func TestCommissionBounds(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_INVENTORIED}
	if err := StartCommission(m, "", "op", time.Now()); err != nil {
		t.Fatal(err)
	}
	c := m.GetCommission()
	if c.GetProfile() != "quick" || c.GetStatus() != CommissionPending || len(c.GetSteps()) != 5 || !strings.HasPrefix(c.GetCommissionId(), CommissionIDPrefix) {
		t.Fatalf("started %v", c)
	}
	c.Steps[0].Seconds = 99 // a copy: the profile is untouched
	if CommissionProfiles["quick"][0].GetSeconds() != 0 {
		t.Fatal("StartCommission shares the profile's steps")
	}
	got := CleanCommissionTest(c, &inventoryv1.CommissionTest{Name: "fio", Target: strings.Repeat("t", 100), Result: "pass",
		Summary: strings.Repeat("s", 300), Output: strings.Repeat("é", 3000) + "\xff", DurationMs: -5})
	if len(got.GetTarget()) != maxCommissionTarget || len(got.GetSummary()) != maxCommissionSummary || len(got.GetOutput()) > MaxCommissionOutput ||
		!strings.HasSuffix(got.GetOutput(), "é") || got.GetDurationMs() != 0 || got.GetResult() != "pass" {
		t.Fatalf("cleaned %d %d %d %q %d", len(got.GetTarget()), len(got.GetSummary()), len(got.GetOutput()), got.GetOutput()[len(got.GetOutput())-4:], got.GetDurationMs())
	}
	if got := CleanCommissionTest(c, &inventoryv1.CommissionTest{Name: "dd", Result: "pass"}); got.GetResult() != "fail" {
		t.Errorf("unknown kind: %v", got)
	}
	if got := CleanCommissionTest(c, &inventoryv1.CommissionTest{Name: "fio", Result: "PASS!"}); got.GetResult() != "fail" {
		t.Errorf("unknown result: %v", got)
	}
	for range MaxCommissionTests {
		c.Tests = append(c.Tests, &inventoryv1.CommissionTest{})
	}
	if got := CleanCommissionTest(c, &inventoryv1.CommissionTest{Name: "fio", Result: "pass"}); got != nil {
		t.Errorf("test %d kept", MaxCommissionTests+1)
	}
}

// TestCommissionHold: running and failed-not-cleared hold a machine;
// passed and cleared do not; a machine in use is not commissioned.
func TestCommissionHold(t *testing.T) {
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_READY}
	for status, held := range map[string]bool{"": false, CommissionPending: true, CommissionRunning: true, CommissionPassed: false, CommissionFailed: true} {
		m.Commission = nil
		if status != "" {
			m.Commission = &inventoryv1.Commission{Status: status}
		}
		if err := CommissionHold(m); (err != nil) != held || (err != nil && !errors.Is(err, apierr.ErrPrecondition)) {
			t.Errorf("%q: %v", status, err)
		}
	}
	m.Commission = &inventoryv1.Commission{Status: CommissionFailed, Cleared: true}
	if err := CommissionHold(m); err != nil {
		t.Errorf("cleared: %v", err)
	}
	for _, s := range []inventoryv1.Machine_MachineState{inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYED, inventoryv1.Machine_INSTALLING, inventoryv1.Machine_MAINTENANCE} {
		if err := StartCommission(&inventoryv1.Machine{Name: "m", State: s}, "quick", "op", time.Now()); err == nil {
			t.Errorf("%s commissioned", s)
		}
	}
	if err := StartCommission(&inventoryv1.Machine{Name: "m", State: inventoryv1.Machine_READY}, "burn", "op", time.Now()); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("unknown profile: %v", err)
	}
}
