package session

import (
	"context"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

type fakeCommissioner struct{}

func (fakeCommissioner) Commission(_ context.Context, plan *nodev1.CommissionPlan, progress func(*nodev1.Progress)) error {
	id := plan.GetCommissionId()
	progress(&nodev1.Progress{Step: "test", InstallId: id, CommissionTest: &inventoryv1.CommissionTest{Name: "link", Target: "eth0", Result: "pass"}})
	progress(&nodev1.Progress{Step: "commissioned", Done: true, InstallId: id})
	return nil
}

// TestCommissionPlan: a commissioning plan runs as a job whose results
// reach the appliance; an agent without a Commissioner refuses it.
func TestCommissionPlan(t *testing.T) {
	cmd := func(id string) *nodev1.ApplianceMessage {
		return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Commission{Commission: &nodev1.CommissionPlan{CommissionId: id, Profile: "quick"}}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	power := &fakePower{}

	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{cmd("commission-1")}}
	endpoint, ca := serve(t, f, true)
	go Run(ctx, config(endpoint, Fingerprint(ca), &syncBuffer{}, power))
	waitFor(t, "the refusal", func() bool { return len(f.progressOf("commission-1")) == 1 })
	if got := f.progressOf("commission-1")[0]; got != "commissioned error: not supported by this agent yet (done)" {
		t.Errorf("refusal %q", got)
	}

	g := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{cmd("commission-2")}}
	endpoint, ca = serve(t, g, true)
	cfg := config(endpoint, Fingerprint(ca), &syncBuffer{}, power)
	cfg.Commissioner = fakeCommissioner{}
	go Run(ctx, cfg)
	waitFor(t, "the run", func() bool { return len(g.progressOf("commission-2")) == 2 })
	if got := g.progressOf("commission-2"); strings.Join(got, "|") != "test|commissioned (done)" {
		t.Errorf("progress %q", got)
	}
}
