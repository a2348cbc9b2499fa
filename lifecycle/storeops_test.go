package lifecycle

import (
	"cmp"
	"context"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/storecheck"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// machineKeys: these tests count the operations on machine records only.
const machineKeys = store.MachinesPrefix

// TestStoreOpsPerReport: a Register or a Progress message changes the
// machine record in one store mutation. Figures before this package
// existed (inventory held the lifecycle), measured with the same
// scenario: Register of a DHCP-seen machine with an in-band BMC address
// under auto-accept 6 reads / 3 writes; Progress (a step) 3 / 1;
// Register again 3 / 2.
func TestStoreOpsPerReport(t *testing.T) {
	cs := &storecheck.Counting{Store: mem.New()}
	h := newHarness(t, cs, harnessOpt{auto: true})
	ctx := context.Background()
	mac := "52:54:00:00:00:01"
	if _, _, err := h.inv.EnsureMachineForMAC(ctx, mac); err != nil { // DHCP saw it
		t.Fatal(err)
	}
	f := facts("SN123", "8c3f5b7e-0000-4000-8000-000000000001", mac, "52:54:00:00:01:01")
	f.Bmc = &inventoryv1.Facts_BmcLan{Ipv4Address: "10.9.0.1"}
	type row struct {
		what                    string
		reads, writes, maxReads int
	}
	var rows []row
	// before: the same scenario when inventory held the lifecycle.
	before := map[string]string{
		"Register (first report, auto-accepted, in-band BMC)": "6 reads, 3 writes",
		"Progress (a step)":                "3 reads, 1 writes",
		"Register again (agent restarted)": "3 reads, 2 writes",
	}
	check := func(what string, maxReads int, fn func()) {
		t.Helper()
		ops := cs.Measure(fn)
		r, w := ops.Reads(machineKeys), ops.Writes(machineKeys)
		rows = append(rows, row{what, r, w, maxReads})
		if w != 1 || r > maxReads {
			t.Errorf("%s: %d machine reads, %d writes; want 1 write and at most %d reads", what, r, w, maxReads)
		}
	}
	var name string
	check("Register (first report, auto-accepted, in-band BMC)", 2, func() {
		resp, err := h.client.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f})
		if err != nil {
			t.Fatal(err)
		}
		name = resp.GetMachineName()
	})
	if m := h.machine(name); m.GetState() != inventoryv1.Machine_INSTALLING || m.GetBmc().GetAddress() != "10.9.0.1" {
		t.Fatalf("after register: %v bmc %v", m.GetState(), m.GetBmc())
	}
	a := h.connect(mac, f)
	id := a.next().GetInstall().GetInstallId()
	// waitFor polls the store underneath the counter.
	waitFor := func(ok func(m *inventoryv1.Machine) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			var m inventoryv1.Machine
			if _, err := record.Get(ctx, cs.Store, machineKeys+name, &m); err == nil && ok(&m) {
				time.Sleep(20 * time.Millisecond) // anything that follows the write
				return
			}
		}
		t.Fatal("machine never changed")
	}
	check("Progress (a step)", 1, func() {
		a.progress(id, "partition", false, "")
		waitFor(func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "partition" })
	})
	check("Progress (done: reboot command over the session)", 1, func() {
		a.progress(id, "done", true, "")
		waitFor(func(m *inventoryv1.Machine) bool { return m.GetInstall().GetDone() })
		if a.next().GetReboot() == nil {
			t.Error("no reboot command")
		}
	})
	check("Register again (agent restarted)", 2, func() {
		if _, err := h.client.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f}); err != nil {
			t.Fatal(err)
		}
	})
	for _, r := range rows {
		t.Logf("%-52s machine record: %d reads, %d writes (before: %s)", r.what, r.reads, r.writes, cmp.Or(before[r.what], "not measured"))
	}
}

// TestSessionOpenNoSecondWrite: Register writes last_seen in its one
// machine mutation, so the session's first heartbeat right after it
// writes nothing more (it rewrote the machine record, facts and all,
// before Register and the session open shared one mutation: 2 writes).
func TestSessionOpenNoSecondWrite(t *testing.T) {
	cs := &storecheck.Counting{Store: mem.New()}
	h := newHarness(t, cs, harnessOpt{})
	mac := "52:54:00:00:00:02"
	f := facts("SN124", "8c3f5b7e-0000-4000-8000-000000000002", mac)
	if _, _, err := h.inv.EnsureMachineForMAC(context.Background(), mac); err != nil {
		t.Fatal(err)
	}
	w := cs.Measure(func() {
		h.connect(mac, f)
		time.Sleep(50 * time.Millisecond) // anything that follows the first heartbeat
	}).Writes(machineKeys)
	if w != 1 {
		t.Errorf("Register + session open: %d machine writes, want 1 (Register's)", w)
	}
}
