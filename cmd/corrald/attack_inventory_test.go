package main

// Attack tests for an inventory anyone on the boot LAN could fill: the cap
// on machines waiting to be accepted (docs/security.md, "Claims":
// --max-unaccepted) and on a machine's fact history ("Report caps"),
// against the built corrald: boot HTTP on loopback for the per-boot
// tokens, a real gRPC client over TLS for the agent edge and the
// operator, /metrics over plain HTTP. The report caps themselves are in
// TestAttackTerminalEscapesAndReportCaps.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// TestAttackUnacceptedCap: machines on the boot LAN, each with its own
// per-boot token, register until --max-unaccepted (3) machines wait to be
// accepted. The next distinct machine is refused ResourceExhausted naming
// the cap and its flag, counted in corral_report_refusals_total, logged
// once however often it retries, and stores nothing; so is a claim that
// would be parked. The machines already registered are unchanged and
// still report. Once the operator accepts one, and then deletes one, a
// new machine registers each time.
func TestAttackUnacceptedCap(t *testing.T) {
	metrics := freePort(t)
	c := startCredCorrald(t, "--max-unaccepted", "3", "--metrics-listen", metrics)
	ctx := context.Background()
	machines := inventoryv1.NewMachineServiceClient(c.admin)
	mac := func(i int) string { return fmt.Sprintf("52:54:00:dd:00:%02x", i) }
	facts := func(i int) *inventoryv1.Facts { return machinefacts.QEMU(fmt.Sprintf("SN-CAP-%d", i), "", mac(i)) }
	agents := map[int]nodev1.AgentServiceClient{} // each machine's, with the token of its script
	register := func(i int, f *inventoryv1.Facts) (*nodev1.RegisterResponse, error) {
		if agents[i] == nil {
			agents[i] = c.agent(c.token(mac(i), fmt.Sprintf("127.0.8.%d", i)))
		}
		return agents[i].Register(ctx, &nodev1.RegisterRequest{BootMac: mac(i), Facts: f})
	}
	var names []string
	for i := 1; i <= 3; i++ {
		reg, err := register(i, facts(i))
		if err != nil {
			t.Fatalf("machine %d of the cap: %v", i, err)
		}
		names = append(names, reg.GetMachineName())
	}
	before := map[string]*inventoryv1.Machine{}
	for _, n := range names {
		before[n] = c.machine(n)
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		for n, m := range before {
			if diff := cmp.Diff(m, c.machine(n), protocmp.Transform()); diff != "" {
				t.Errorf("%s changed (-before +after):\n%s", n, diff)
			}
		}
	}
	const capMsg = "3 machines are registered and not accepted (the limit, --max-unaccepted)"

	t.Run("a new machine over the cap is refused", func(t *testing.T) {
		for range 5 { // an agent retrying
			_, err := register(4, facts(4))
			wantCode(t, "the fourth machine", err, codes.ResourceExhausted, capMsg)
		}
		// A claim that would be parked needs a record too.
		_, err := register(5, machinefacts.QEMU("SN-CAP-1", "", mac(5)))
		wantCode(t, "a claim on machine 1's serial", err, codes.ResourceExhausted, capMsg)
		if got := metricValue(t, metrics, `corral_report_refusals_total{reason="unaccepted_cap"}`); got != 6 {
			t.Errorf("corral_report_refusals_total{reason=\"unaccepted_cap\"} = %v, want 6", got)
		}
		if n := strings.Count(c.logs.String(), "unaccepted-machine cap reached"); n != 1 {
			t.Errorf("the cap was logged %d times for 6 refusals, want once (a minute apart)", n)
		}
		for _, i := range []int{4, 5} {
			l, err := machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Mac: mac(i)})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range l.GetMachines() {
				if m.GetState() != inventoryv1.Machine_DISCOVERED || m.GetFacts() != nil || m.GetSerial() != "" {
					t.Errorf("a refused report left a record: %v", m)
				}
			}
		}
		unchanged(t)
	})

	t.Run("a registered machine still reports at the cap", func(t *testing.T) {
		f := facts(1)
		f.Memory.TotalBytes = 4 << 30
		reg, err := register(1, f)
		if err != nil {
			t.Fatalf("machine 1 reporting again at the cap: %v", err)
		}
		if reg.GetMachineName() != names[0] || c.machine(names[0]).GetFacts().GetMemory().GetTotalBytes() != 4<<30 {
			t.Fatalf("machine 1's report landed on %s", reg.GetMachineName())
		}
		before[names[0]] = c.machine(names[0])
	})

	t.Run("accepting or deleting frees a slot", func(t *testing.T) {
		if _, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: names[0]}); err != nil {
			t.Fatal(err)
		}
		if _, err := register(4, facts(4)); err != nil {
			t.Fatalf("a new machine after an accept: %v", err)
		}
		_, err := register(6, facts(6))
		wantCode(t, "the next machine", err, codes.ResourceExhausted, capMsg)
		if _, err := machines.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: names[1]}); err != nil {
			t.Fatal(err)
		}
		if _, err := register(6, facts(6)); err != nil {
			t.Fatalf("a new machine after a delete: %v", err)
		}
		delete(before, names[0])
		delete(before, names[1])
		unchanged(t)
	})
}

// TestAttackFactHistoryCap: two machines report again and again, each
// report listing eight new disks, so that each adds sixteen changes to the
// machine's fact history: one with long disk models (the byte cap
// binds), one with short ones (the entry cap binds). Each history keeps
// the newest changes within --max-fact-history-entries and
// --max-fact-history-bytes, and no report is refused for it.
func TestAttackFactHistoryCap(t *testing.T) {
	const maxEntries, maxBytes = 20, 4096
	c := startCredCorrald(t, "--max-fact-history-entries", fmt.Sprint(maxEntries), "--max-fact-history-bytes", fmt.Sprint(maxBytes))
	ctx := context.Background()
	const rounds = 9 // within the per-token burst (--agent-burst-per-token 10)
	for i, model := range []string{strings.Repeat("m", 200), "m"} {
		mac := fmt.Sprintf("52:54:00:dd:01:%02x", i+1)
		agent := c.agent(c.token(mac, fmt.Sprintf("127.0.8.%d", 101+i)))
		var name string
		for r := range rounds {
			f := machinefacts.QEMU(fmt.Sprintf("SN-HIST-%d", i), "", mac)
			f.Disks = nil
			for d := range 8 {
				f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{Name: fmt.Sprintf("sd%c", 'a'+d), SizeBytes: 1 << 40,
					Serial: fmt.Sprintf("R%02d-D%d", r, d), Model: model})
			}
			reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: f})
			if err != nil {
				t.Fatalf("%s's report %d: %v", mac, r, err)
			}
			name = reg.GetMachineName()
		}
		h := c.machine(name).GetFactHistory()
		size := 0
		for _, e := range h {
			size += proto.Size(e)
		}
		t.Logf("%s: %d reports of 16 changes each (models of %d bytes): %d history entries, %d bytes kept", name, rounds, len(model), len(h), size)
		if len(h) == 0 || len(h) > maxEntries || size > maxBytes {
			t.Errorf("%s: fact history of %d entries, %d bytes; want 1-%d entries within %d bytes", name, len(h), size, maxEntries, maxBytes)
		}
		if bound := len(h) == maxEntries || size > maxBytes-300; !bound {
			t.Errorf("%s: neither cap reached (%d entries, %d bytes): the test does not fill the history", name, len(h), size)
		}
		// The newest changes are kept: the last report's disks.
		if last := h[len(h)-1]; !strings.Contains(last.GetPath(), fmt.Sprintf("R%02d-", rounds-1)) {
			t.Errorf("%s: the newest history entry %v is not of the last report", name, last)
		}
	}
}
