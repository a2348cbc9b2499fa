package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// TestWatchdogFailedAfterInstallThenNodeReady: a machine without a BMC
// whose reboot into the hypervisor outlasts the boot watchdog is FAILED;
// when its node (the install's certificate) then comes READY, it is
// DEPLOYED after all, and the timeline says so. A machine that failed
// before its install was done stays FAILED whatever a node does.
func TestWatchdogFailedAfterInstallThenNodeReady(t *testing.T) {
	tests := map[string]struct {
		installDone bool
		want        inventoryv1.Machine_MachineState
	}{
		"install done: deployed late":    {installDone: true, want: inventoryv1.Machine_DEPLOYED},
		"install not done: stays failed": {installDone: false, want: inventoryv1.Machine_FAILED},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil, harnessOpt{})
			ctx := context.Background()
			a := h.connect(mac1, facts("S1", "", mac1))
			if _, err := h.lc.Accept(ctx, a.name, "", false); err != nil {
				t.Fatal(err)
			}
			id := a.next().GetInstall().GetInstallId()
			if tc.installDone {
				a.progress(id, "done", true, "")
				if a.next().GetReboot() == nil {
					t.Fatal("no reboot")
				}
			} else {
				h.lc.armWatchdog(ctx, a.name, "test")
			}
			a.close()
			h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedAt() != nil })
			h.clk.Advance(DefaultBootWatchdog + time.Second)
			h.reconcile()
			if m := h.machine(a.name); m.GetState() != inventoryv1.Machine_FAILED || !strings.HasPrefix(m.GetStateReason(), watchdogReasonPrefix) {
				t.Fatalf("after the watchdog: %v %q", m.GetState(), m.GetStateReason())
			}
			h.clk.Advance(time.Second)
			h.applyNode(a.name)
			h.reconcile()
			m := h.machine(a.name)
			if m.GetState() != tc.want {
				t.Fatalf("after the node's heartbeat: %v %q, want %v", m.GetState(), m.GetStateReason(), tc.want)
			}
		})
	}
}
