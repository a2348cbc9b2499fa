package main

// Attack tests for the claim rules (docs/security.md, "Claims"), against
// the built corrald: boot HTTP on loopback for the per-boot tokens and a
// real gRPC client over TLS for the agent edge and the operator.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// TestAttackClaims: a machine with its own lease and its own per-boot
// token reports another machine's serial (takeover by serial), or lists
// MACs it does not boot from (MAC squatting). The first is parked in
// CONFLICT, the victim's record unchanged, the claim on both timelines,
// and the parked record cannot be accepted; the second binds nothing, so
// the squatted MACs still boot discovery.
func TestAttackClaims(t *testing.T) {
	c := startCredCorrald(t)
	ctx := context.Background()
	const (
		victim, attacker       = "52:54:00:aa:01:01", "52:54:00:bb:01:01"
		victimSN, victimUUID   = "SN-VICTIM-2", "6a1c0f3e-aaaa-4a5b-9c2d-000000000002"
		victimAddr, attackAddr = "127.0.1.2", "127.0.2.2"
	)
	tv := c.token(victim, victimAddr)
	reg, err := c.agent(tv).Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: machinefacts.QEMU(victimSN, victimUUID, victim)})
	if err != nil {
		t.Fatal(err)
	}
	mv := reg.GetMachineName()
	before := c.machine(mv)
	machines := inventoryv1.NewMachineServiceClient(c.admin)

	t.Run("takeover by serial", func(t *testing.T) {
		ta := c.token(attacker, attackAddr)
		for _, f := range []*inventoryv1.Facts{
			machinefacts.QEMU(victimSN, "", attacker),
			machinefacts.QEMU(victimSN, victimUUID, attacker, victim),
		} {
			_, err := c.agent(ta).Register(ctx, &nodev1.RegisterRequest{BootMac: attacker, Facts: f})
			wantCode(t, "Register with the victim's serial", err, codes.PermissionDenied, "parked as machine conflict-525400bb0101")
		}
		if diff := cmp.Diff(before, c.machine(mv), protocmp.Transform()); diff != "" {
			t.Errorf("the victim's record changed (-before +after):\n%s", diff)
		}
		parked := c.machine("conflict-525400bb0101")
		if parked.GetState() != inventoryv1.Machine_CONFLICT || parked.GetConflict().GetMachine() != mv || parked.GetConflict().GetReports() != 2 {
			t.Fatalf("parked record: state %s, conflict %v", parked.GetState(), parked.GetConflict())
		}
		c.waitEntry(victim, "register-conflict", "parked as conflict-525400bb0101")
		c.waitEntry(attacker, "register-conflict", "parked as conflict-525400bb0101")
		_, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: parked.GetName(), Disk: "auto"})
		wantCode(t, "accept of a parked report", err, codes.FailedPrecondition, "CONFLICT")
		// The attacker's MAC boots as the parked record, and the victim's
		// MAC still boots the victim.
		if m, err := machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Mac: victim}); err != nil || len(m.GetMachines()) != 1 || m.GetMachines()[0].GetName() != mv {
			t.Fatalf("machines with the victim's MAC: %v, %v", m, err)
		}
		// The operator rejects it: it is gone, the victim is as it was.
		if _, err := machines.RejectMachine(ctx, &inventoryv1.RejectMachineRequest{Name: parked.GetName()}); err != nil {
			t.Fatal(err)
		}
		c.waitEntry(attacker, "rejected", "parked report conflict-525400bb0101 rejected")
		if diff := cmp.Diff(before, c.machine(mv), protocmp.Transform()); diff != "" {
			t.Errorf("the victim's record changed (-before +after):\n%s", diff)
		}
	})

	t.Run("MAC squatting", func(t *testing.T) {
		const squatter = "52:54:00:bb:02:01"
		ts := c.token(squatter, "127.0.2.3")
		macs := []string{squatter}
		for i := range 60 {
			macs = append(macs, fmt.Sprintf("52:54:00:cc:00:%02x", i))
		}
		if _, err := c.agent(ts).Register(ctx, &nodev1.RegisterRequest{BootMac: squatter, Facts: machinefacts.QEMU("SN-SQUAT", "", macs...)}); err != nil {
			t.Fatal(err)
		}
		for _, mac := range []string{macs[1], macs[30], macs[60]} {
			code, _, body := c.script(mac, "127.0.3.1")
			if code != http.StatusOK || !strings.Contains(body, "kernel ") || strings.Contains(body, "boots from its local disk") {
				t.Fatalf("script of squatted MAC %s: %d\n%s", mac, code, body)
			}
		}
	})
}
